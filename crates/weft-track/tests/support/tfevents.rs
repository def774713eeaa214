//! A reader of TensorBoard event files written for the tests, independent of the writer: a
//! bitwise CRC32C, the TFRecord framing, and the few protobuf fields of `Event` and `Summary`.

/// CRC32C (Castagnoli, reflected polynomial 0x82f63b78), bit by bit.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

pub fn masked(crc: u32) -> u32 {
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One decoded event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub wall_time: f64,
    pub step: i64,
    pub file_version: Option<String>,
    /// `(tag, simple_value)` of the summary's values.
    pub values: Vec<(String, f32)>,
}

fn varint(b: &[u8], i: &mut usize) -> u64 {
    let (mut x, mut shift) = (0u64, 0);
    loop {
        let byte = b[*i];
        *i += 1;
        x |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return x;
        }
        shift += 7;
    }
}

/// The fields of one message: `(field, wire type, bytes)` (varints re-encoded as 8 LE bytes).
fn fields(b: &[u8]) -> Vec<(u64, u64, Vec<u8>)> {
    let mut i = 0;
    let mut out = Vec::new();
    while i < b.len() {
        let key = varint(b, &mut i);
        let (field, wire) = (key >> 3, key & 7);
        let data = match wire {
            0 => varint(b, &mut i).to_le_bytes().to_vec(),
            1 => {
                i += 8;
                b[i - 8..i].to_vec()
            }
            2 => {
                let n = varint(b, &mut i) as usize;
                i += n;
                b[i - n..i].to_vec()
            }
            5 => {
                i += 4;
                b[i - 4..i].to_vec()
            }
            w => panic!("wire type {w} at byte {i}"),
        };
        out.push((field, wire, data));
    }
    out
}

fn event(payload: &[u8]) -> Event {
    let mut e = Event {
        wall_time: f64::NAN,
        step: 0,
        file_version: None,
        values: Vec::new(),
    };
    for (field, wire, data) in fields(payload) {
        match (field, wire) {
            (1, 1) => e.wall_time = f64::from_le_bytes(data.try_into().unwrap()),
            (2, 0) => e.step = i64::from_le_bytes(data.try_into().unwrap()),
            (3, 2) => e.file_version = Some(String::from_utf8(data).unwrap()),
            (5, 2) => {
                for (f, w, value) in fields(&data) {
                    assert_eq!((f, w), (1, 2), "Summary holds only values");
                    let (mut tag, mut simple) = (String::new(), f32::NAN);
                    for (f, w, d) in fields(&value) {
                        match (f, w) {
                            (1, 2) => tag = String::from_utf8(d).unwrap(),
                            (2, 5) => simple = f32::from_le_bytes(d.try_into().unwrap()),
                            other => panic!("unexpected Summary.Value field {other:?}"),
                        }
                    }
                    e.values.push((tag, simple));
                }
            }
            other => panic!("unexpected Event field {other:?}"),
        }
    }
    e
}

/// Every event of an event file, each record's two checksums checked.
pub fn read(bytes: &[u8]) -> Vec<Event> {
    let mut i = 0;
    let mut out = Vec::new();
    while i < bytes.len() {
        assert!(bytes.len() - i >= 12, "a truncated record header at byte {i}");
        let len_bytes = &bytes[i..i + 8];
        let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
        let len_crc = u32::from_le_bytes(bytes[i + 8..i + 12].try_into().unwrap());
        assert_eq!(
            len_crc,
            masked(crc32c(len_bytes)),
            "length checksum of the record at byte {i}"
        );
        let payload = &bytes[i + 12..i + 12 + len];
        let crc = u32::from_le_bytes(bytes[i + 12 + len..i + 16 + len].try_into().unwrap());
        assert_eq!(
            crc,
            masked(crc32c(payload)),
            "payload checksum of the record at byte {i}"
        );
        out.push(event(payload));
        i += 16 + len;
    }
    out
}
