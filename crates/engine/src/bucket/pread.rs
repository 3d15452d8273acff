//! Ranged reads of a local object file that never hold a runtime thread on the disk.
//!
//! What the page cache holds is read in place: a blocking pool's round trip costs more than a
//! small read. What it does not hold is read on the blocking pool. Large objects are written
//! with direct I/O, so a cold read goes to the disk for many milliseconds. On a runtime thread
//! that would stall the decryption of what earlier reads brought. On the pool, reads overlap
//! each other and the decryption.

use std::fs::File;
use std::io::{Error, ErrorKind, Result};
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// `len` bytes of `file` at `at`; `UnexpectedEof` when the file ends before them.
pub(super) async fn read_range(file: Arc<File>, at: u64, len: usize) -> Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(len);
    while buf.len() < len {
        match append(&file, &mut buf, at, true) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            // Not (all) in the page cache, or a filesystem that cannot tell without reading.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EOPNOTSUPP)) => {
                return tokio::task::spawn_blocking(move || {
                    while buf.len() < len {
                        match append(&file, &mut buf, at, false) {
                            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                            Ok(_) => {}
                            Err(e) if e.kind() == ErrorKind::Interrupted => {}
                            Err(e) => return Err(e),
                        }
                    }
                    Ok(buf)
                })
                .await
                .map_err(Error::other)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(buf)
}

/// Reads into `buf`'s spare capacity the bytes that follow those it holds (`buf` holds the
/// range from `at`), with `RWF_NOWAIT` when `nowait`; answers how many it read. The spare
/// capacity is not zeroed first: the kernel writes it, and `buf` grows only by what it wrote.
fn append(file: &File, buf: &mut Vec<u8>, at: u64, nowait: bool) -> Result<usize> {
    let spare = buf.spare_capacity_mut();
    let iov = libc::iovec {
        iov_base: spare.as_mut_ptr().cast(),
        iov_len: spare.len(),
    };
    let offset = at
        .checked_add(buf.len() as u64)
        .and_then(|o| i64::try_from(o).ok())
        .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "offset beyond a file's limit"))?;
    let flags = if nowait { libc::RWF_NOWAIT } else { 0 };
    // SAFETY: the iovec names `spare`, memory `buf` owns and does not use; the kernel writes at
    // most `iov_len` bytes into it and says how many.
    let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, offset, flags) };
    if n < 0 {
        return Err(Error::last_os_error());
    }
    let n = n as usize;
    // SAFETY: the kernel initialised the first `n` bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[tokio::test]
    async fn reads_exact_ranges_and_refuses_past_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("object");
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&data)
            .unwrap();
        let file = Arc::new(File::open(&path).unwrap());
        // Cold (after the kernel drops what it can) and warm: the same bytes either way.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        for (at, len) in [(0, 300_000), (12_345, 100_000), (299_999, 1), (5, 0)] {
            let got = read_range(file.clone(), at as u64, len).await.unwrap();
            assert_eq!(got, data[at..at + len], "{at}+{len}");
        }
        let e = read_range(file.clone(), 299_000, 2_000).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnexpectedEof);
        let e = read_range(file, u64::MAX - 1, 10).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
    }
}
