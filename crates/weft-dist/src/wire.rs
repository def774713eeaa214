//! Little-endian integers and length-prefixed byte strings on a stream, with size limits so a
//! malformed or hostile length never becomes a huge allocation.

use std::io::{Read, Write};

use crate::error::{io, Error, Result};

pub(crate) fn write_u64(w: &mut impl Write, v: u64) -> std::io::Result<()> {
    w.write_all(&v.to_le_bytes())
}

pub(crate) fn read_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

pub(crate) fn read_u8(r: &mut impl Read) -> std::io::Result<u8> {
    let mut b = [0u8; 1];
    r.read_exact(&mut b)?;
    Ok(b[0])
}

/// Writes `len` then the bytes.
pub(crate) fn write_bytes(w: &mut impl Write, b: &[u8]) -> std::io::Result<()> {
    write_u64(w, b.len() as u64)?;
    w.write_all(b)
}

/// Reads a byte string written by [`write_bytes`], refusing lengths above `max`; `what` names the
/// stream in errors.
pub(crate) fn read_bytes(r: &mut impl Read, max: usize, what: &str) -> Result<Vec<u8>> {
    let len = read_u64(r).map_err(|e| io(what, e))?;
    if len > max as u64 {
        return Err(Error::Io(format!(
            "{what}: message of {len} bytes exceeds the limit of {max}"
        )));
    }
    let mut v = vec![0u8; len as usize];
    r.read_exact(&mut v).map_err(|e| io(what, e))?;
    Ok(v)
}
