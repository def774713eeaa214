//! Host and port put together the way sockets read them back: an IPv6 address in brackets
//! (`[::1]:29500`), so that `MASTER_ADDR=::1` and `--master-addr [::1]` both work.

use std::net::IpAddr;

/// `host` without the brackets an IPv6 address may be given in (`[::1]` → `::1`).
pub fn bare(host: &str) -> &str {
    let host = host.trim();
    host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host)
}

/// `host:port`, with an IPv6 `host` (bracketed or not) in brackets.
pub fn host_port(host: &str, port: u16) -> String {
    let host = bare(host);
    match host.parse::<IpAddr>() {
        Ok(ip @ IpAddr::V6(_)) => format!("[{ip}]:{port}"),
        _ => format!("{host}:{port}"),
    }
}

/// The address that listens on every interface of the family `host` is in (`[::]` for an
/// IPv6 address, `0.0.0.0` otherwise, a name included).
pub fn any_interface(host: &str) -> &'static str {
    match bare(host).parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) => "[::]",
        _ => "0.0.0.0",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_addresses_are_bracketed_once() {
        assert_eq!(host_port("::1", 5), "[::1]:5");
        assert_eq!(host_port("[::1]", 5), "[::1]:5");
        assert_eq!(host_port(" fe80::1 ", 5), "[fe80::1]:5");
        assert_eq!(host_port("10.0.0.2", 5), "10.0.0.2:5");
        assert_eq!(host_port("node-4", 5), "node-4:5");
        assert_eq!(any_interface("[::1]"), "[::]");
        assert_eq!(any_interface("::"), "[::]");
        assert_eq!(any_interface("127.0.0.1"), "0.0.0.0");
        assert_eq!(any_interface("node-4"), "0.0.0.0");
        for a in ["::1", "[::1]", "127.0.0.1"] {
            let parsed: std::net::SocketAddr = host_port(a, 7).parse().unwrap();
            assert_eq!(parsed.port(), 7, "{a}");
        }
    }
}
