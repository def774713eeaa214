//! The guard against DNS rebinding on loopback ports: a web page the user visits can make its own
//! host name resolve to 127.0.0.1 and then read a loopback server as if it were its own origin,
//! but the browser still sends that name as the `Host` header. A server that listens on loopback
//! therefore answers only requests whose `Host` names loopback (`localhost`, `127.0.0.1`, any
//! `127.x.y.z`, `[::1]`, with or without a port); others get 403. A request target in absolute
//! form (`GET http://name/path`) names its host too, and it must be loopback as well (a server
//! takes the target's host over the header's, RFC 9112 3.2.2); a request with two `Host`
//! headers is refused (400, as RFC 9112 3.2 says), as a proxy or the server might read either.
//! Requests without a `Host` (HTTP/1.0 tools) are not from a browser and pass. Refusals are JSON
//! (`{"error": ...}`, OpenAI's shape on `/v1/*`).

use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

use crate::error::{echo, refusal};

/// Whether a `Host` header value names this machine's loopback interface.
pub fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        // [::1] or [::1]:8080
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => match host.rsplit_once(':') {
            Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        },
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The middleware: 400 for a request with more than one `Host`, 403 for one whose `Host` or
/// absolute-form target does not name loopback.
pub async fn loopback_only(req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let host = hosts.next().map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned());
    if hosts.next().is_some() {
        return refusal(
            &path,
            StatusCode::BAD_REQUEST,
            "the request has more than one Host header; send one",
        );
    }
    let named = [
        req.uri().authority().map(|a| ("target", a.as_str().to_string())),
        host.map(|h| ("Host", h)),
    ];
    for (what, name) in named.into_iter().flatten() {
        // an authority with user info (`user@host`) names the host after the `@`
        let bare = name.rsplit('@').next().unwrap_or("");
        if !is_loopback_host(bare) {
            return refusal(
                &path,
                StatusCode::FORBIDDEN,
                format!(
                    "{what} {} is not this machine's loopback name: this server answers loopback requests only \
                     (start it with --host to serve other names)",
                    echo(&name)
                ),
            );
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::is_loopback_host;

    #[test]
    fn loopback_names_pass_and_others_do_not() {
        for ok in [
            "localhost",
            "LOCALHOST:8080",
            "127.0.0.1",
            "127.0.0.1:5000",
            "127.1.2.3:80",
            "[::1]",
            "[::1]:8081",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "10.0.0.1",
            "[::2]:80",
            "localhost.evil.example",
            "",
            "127.0.0.1.nip.io",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }
}
