//! Record marking (RFC 5531 section 11): over TCP each RPC message is a record sent as
//! fragments, each behind a 4-byte header whose top bit marks the last fragment and whose
//! other 31 bits give the fragment's length.

use std::io;
use tokio::io::{AsyncRead, AsyncReadExt};

const LAST_FRAGMENT: u32 = 1 << 31;

/// Reads one record of at most `max` bytes; None at a clean end of the stream (between
/// records). A longer record is an InvalidData error: the stream cannot be trusted after it.
pub async fn read_record<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
) -> io::Result<Option<Vec<u8>>> {
    let mut record = Vec::new();
    loop {
        let mut head = [0u8; 4];
        match r.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && record.is_empty() => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        }
        let head = u32::from_be_bytes(head);
        let len = (head & !LAST_FRAGMENT) as usize;
        if record.len() + len > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "an RPC record of more than {} bytes (the limit is {max})",
                    record.len() + len
                ),
            ));
        }
        let at = record.len();
        record.resize(at + len, 0);
        r.read_exact(&mut record[at..]).await?;
        if head & LAST_FRAGMENT != 0 {
            return Ok(Some(record));
        }
    }
}

/// `message` as one record of one fragment, ready to write.
pub fn frame(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + message.len());
    out.extend_from_slice(&record_mark(message.len()));
    out.extend_from_slice(message);
    out
}

/// The mark in front of a message of `len` bytes sent as one (last) fragment.
pub fn record_mark(len: usize) -> [u8; 4] {
    (LAST_FRAGMENT | len as u32).to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fragment(last: bool, data: &[u8]) -> Vec<u8> {
        let mut out = ((data.len() as u32) | if last { LAST_FRAGMENT } else { 0 })
            .to_be_bytes()
            .to_vec();
        out.extend_from_slice(data);
        out
    }

    #[tokio::test]
    async fn fragments_join_into_records_and_limits_hold() {
        let mut stream = fragment(false, b"hello ");
        stream.extend(fragment(false, b""));
        stream.extend(fragment(true, b"world"));
        stream.extend(frame(b"second"));
        let mut r = &stream[..];
        assert_eq!(
            read_record(&mut r, 64).await.unwrap().unwrap(),
            b"hello world"
        );
        assert_eq!(read_record(&mut r, 64).await.unwrap().unwrap(), b"second");
        assert!(read_record(&mut r, 64).await.unwrap().is_none());

        // A fragment claiming 2 GiB is refused before anything is allocated for it.
        let huge = (LAST_FRAGMENT | 0x7fff_ffff).to_be_bytes();
        let e = read_record(&mut &huge[..], 1 << 20).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        // Fragments that add up past the limit, likewise.
        let mut many = Vec::new();
        for _ in 0..5 {
            many.extend(fragment(false, &[0; 300]));
        }
        let e = read_record(&mut &many[..], 1024).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        // A record cut in its middle is an error, not a clean end.
        let cut = &frame(b"cut short")[..8];
        assert!(read_record(&mut &cut[..], 64).await.is_err());
    }
}
