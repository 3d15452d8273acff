//! XDR (RFC 4506): every item a multiple of 4 bytes, big-endian; variable-length opaque data
//! and strings carry a 4-byte length and are padded with zeroes to a 4-byte boundary.
use bytes::Bytes;

/// Why a message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum XdrError {
    #[error("the message ends in the middle of an item")]
    Short,
    #[error("{what} of {len} is longer than the {max} allowed")]
    TooLong {
        what: &'static str,
        len: u64,
        max: u64,
    },
    #[error("{value} is not a valid {what}")]
    Bad { what: &'static str, value: u32 },
}

pub type XdrResult<T> = Result<T, XdrError>;

fn padding(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// Reads items from the front of a message.
pub struct Decoder<'a> {
    b: &'a [u8],
}

impl<'a> Decoder<'a> {
    pub fn new(b: &'a [u8]) -> Decoder<'a> {
        Decoder { b }
    }

    /// What is left undecoded.
    pub fn rest(&self) -> &'a [u8] {
        self.b
    }

    pub fn is_empty(&self) -> bool {
        self.b.is_empty()
    }

    fn take(&mut self, n: usize) -> XdrResult<&'a [u8]> {
        if self.b.len() < n {
            return Err(XdrError::Short);
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }

    pub fn u32(&mut self) -> XdrResult<u32> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    pub fn u64(&mut self) -> XdrResult<u64> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    pub fn bool(&mut self) -> XdrResult<bool> {
        match self.u32()? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(XdrError::Bad {
                what: "boolean",
                value,
            }),
        }
    }

    /// Fixed-length opaque data of `n` bytes (and its padding).
    pub fn fixed(&mut self, n: usize) -> XdrResult<&'a [u8]> {
        let data = self.take(n)?;
        self.take(padding(n))?;
        Ok(data)
    }

    /// Variable-length opaque data of at most `max` bytes; `what` names it in the error.
    pub fn opaque(&mut self, max: usize, what: &'static str) -> XdrResult<&'a [u8]> {
        let len = self.u32()?;
        if len as usize > max {
            return Err(XdrError::TooLong {
                what,
                len: u64::from(len),
                max: max as u64,
            });
        }
        self.fixed(len as usize)
    }

    /// The count of a variable-length array of at most `max` items.
    pub fn count(&mut self, max: usize, what: &'static str) -> XdrResult<usize> {
        let n = self.u32()?;
        if n as usize > max {
            return Err(XdrError::TooLong {
                what,
                len: u64::from(n),
                max: max as u64,
            });
        }
        Ok(n as usize)
    }
}

/// Opaque data at least this large, handed over whole (`opaque_owned`, `append`), stays a part
/// of its own: a 1 MiB READ reply is then written to the socket from the buffer the read
/// filled, not copied into each layer's message on the way (RPC header, record mark).
const PART_BYTES_MIN: usize = 16 * 1024;

/// Builds a message item by item.
#[derive(Default)]
pub struct Encoder {
    /// The message's bytes before `buf`, in order: large data kept as it was handed over.
    parts: Vec<Bytes>,
    buf: Vec<u8>,
}

impl From<Vec<u8>> for Encoder {
    fn from(buf: Vec<u8>) -> Encoder {
        Encoder {
            parts: Vec::new(),
            buf,
        }
    }
}

impl Encoder {
    pub fn new() -> Encoder {
        Encoder::default()
    }

    pub fn u32(&mut self, v: u32) -> &mut Encoder {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Encoder {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn bool(&mut self, v: bool) -> &mut Encoder {
        self.u32(u32::from(v))
    }

    /// Fixed-length opaque data, padded.
    pub fn fixed(&mut self, v: &[u8]) -> &mut Encoder {
        self.buf.extend_from_slice(v);
        self.buf.resize(self.buf.len() + padding(v.len()), 0);
        self
    }

    /// Variable-length opaque data or a string: its length, then the bytes, padded.
    pub fn opaque(&mut self, v: &[u8]) -> &mut Encoder {
        self.u32(v.len() as u32).fixed(v)
    }

    /// Variable-length opaque data handed over whole: as `opaque`, without copying `v` when
    /// it is large.
    pub fn opaque_owned(&mut self, v: Vec<u8>) -> &mut Encoder {
        let pad = padding(v.len());
        self.u32(v.len() as u32).part(Bytes::from(v));
        self.buf.resize(self.buf.len() + pad, 0);
        self
    }

    /// Variable-length opaque data given as pieces in order (a READ's extents): as `opaque`
    /// of their concatenation, each piece a part of its own unless all are small together.
    pub fn opaque_pieces(&mut self, pieces: Vec<Bytes>) -> &mut Encoder {
        let len: usize = pieces.iter().map(Bytes::len).sum();
        self.u32(len as u32);
        if len < PART_BYTES_MIN {
            for p in &pieces {
                self.buf.extend_from_slice(p);
            }
        } else {
            for p in pieces {
                self.push_part(p);
            }
        }
        self.buf.resize(self.buf.len() + padding(len), 0);
        self
    }

    /// Bytes already encoded (an RPC body built elsewhere).
    pub fn raw(&mut self, v: &[u8]) -> &mut Encoder {
        self.buf.extend_from_slice(v);
        self
    }

    /// Another message's bytes after these, its large parts moved rather than copied.
    pub fn append(&mut self, other: Encoder) -> &mut Encoder {
        for p in other.parts {
            self.push_part(p);
        }
        self.buf.extend_from_slice(&other.buf);
        self
    }

    /// `v` as a part of its own when large, else copied in.
    fn part(&mut self, v: Bytes) -> &mut Encoder {
        if v.len() < PART_BYTES_MIN {
            self.buf.extend_from_slice(&v);
        } else {
            self.push_part(v);
        }
        self
    }

    /// `v` as a part of its own, after the bytes encoded so far.
    fn push_part(&mut self, v: Bytes) {
        if !self.buf.is_empty() {
            self.parts.push(Bytes::from(std::mem::take(&mut self.buf)));
        }
        self.parts.push(v);
    }

    pub fn len(&self) -> usize {
        self.parts.iter().map(Bytes::len).sum::<usize>() + self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The message in one buffer.
    pub fn into_bytes(self) -> Vec<u8> {
        if self.parts.is_empty() {
            return self.buf;
        }
        let mut out = Vec::with_capacity(self.len());
        for p in self.parts.iter().map(|p| &p[..]).chain([&self.buf[..]]) {
            out.extend_from_slice(p);
        }
        out
    }

    /// The message as the buffers it was built in, to be written one after another.
    pub fn into_parts(mut self) -> Vec<Bytes> {
        if !self.buf.is_empty() {
            self.parts.push(Bytes::from(self.buf));
        }
        self.parts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_round_trip_with_padding() {
        let mut e = Encoder::new();
        e.u32(7)
            .u64(1 << 40)
            .bool(true)
            .opaque(b"abcde")
            .fixed(b"xy");
        let b = e.into_bytes();
        // 4 + 8 + 4 + (4 + 5 + 3) + (2 + 2)
        assert_eq!(b.len(), 32);
        let mut d = Decoder::new(&b);
        assert_eq!(d.u32(), Ok(7));
        assert_eq!(d.u64(), Ok(1 << 40));
        assert_eq!(d.bool(), Ok(true));
        assert_eq!(d.opaque(16, "name"), Ok(&b"abcde"[..]));
        assert_eq!(d.fixed(2), Ok(&b"xy"[..]));
        assert!(d.is_empty());
    }

    #[test]
    fn large_data_stays_a_part_of_its_own_and_encodes_as_if_copied() {
        let big: Vec<u8> = (0..PART_BYTES_MIN + 3).map(|i| i as u8).collect();
        let (mut owned, mut copied) = (Encoder::new(), Encoder::new());
        owned
            .u32(1)
            .opaque_owned(big.clone())
            .u32(2)
            .opaque_owned(b"small".to_vec());
        copied.u32(1).opaque(&big).u32(2).opaque(b"small");
        let mut head = Encoder::new();
        head.u32(9);
        head.append(owned);
        let mut expected = 9u32.to_be_bytes().to_vec();
        expected.extend(copied.into_bytes());
        assert_eq!(head.len(), expected.len());
        let parts = head.into_parts();
        // The head, the message's header and length, the data itself (not copied), the
        // padding and what follows: parts are moved as they are, never copied again.
        assert_eq!(parts.len(), 4);
        assert_eq!(parts[2], big);
        assert_eq!(parts.concat(), expected);
    }

    #[test]
    fn pieces_stay_parts_of_their_own_unless_small_together() {
        let pieces: Vec<Bytes> = (0..5u8)
            .map(|i| Bytes::from(vec![i; PART_BYTES_MIN / 4 + 1]))
            .collect();
        let all = pieces.concat();
        let (mut gathered, mut copied) = (Encoder::new(), Encoder::new());
        gathered.u32(1).opaque_pieces(pieces.clone()).u32(2);
        copied.u32(1).opaque(&all).u32(2);
        assert_eq!(gathered.len(), copied.len());
        let parts = gathered.into_parts();
        // The header and length, each piece as it was, the padding and what follows.
        assert_eq!(parts.len(), 7);
        assert_eq!(parts[1..6], pieces[..]);
        assert_eq!(parts.concat(), copied.into_bytes());
        // Small together: one buffer.
        let mut small = Encoder::new();
        small.opaque_pieces(vec![Bytes::from_static(b"ab"), Bytes::from_static(b"cde")]);
        let mut expected = Encoder::new();
        expected.opaque(b"abcde");
        assert_eq!(small.into_parts(), vec![Bytes::from(expected.into_bytes())]);
    }

    #[test]
    fn hostile_input_is_an_error_not_an_allocation() {
        // A length of 4 GiB - 1 for opaque data, with 4 bytes behind it.
        let mut d = Decoder::new(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4]);
        assert_eq!(
            d.opaque(1024, "file name"),
            Err(XdrError::TooLong {
                what: "file name",
                len: u64::from(u32::MAX),
                max: 1024
            })
        );
        // Within the limit but past the end of the message.
        let mut d = Decoder::new(&[0, 0, 0, 9, 1, 2, 3, 4]);
        assert_eq!(d.opaque(1024, "data"), Err(XdrError::Short));
        // Padding missing after the data.
        let mut d = Decoder::new(&[0, 0, 0, 3, 1, 2, 3]);
        assert_eq!(d.opaque(1024, "data"), Err(XdrError::Short));
        assert_eq!(
            Decoder::new(&[0, 0, 0, 2]).bool(),
            Err(XdrError::Bad {
                what: "boolean",
                value: 2
            })
        );
        assert_eq!(Decoder::new(&[0, 0, 1]).u32(), Err(XdrError::Short));
        assert_eq!(
            Decoder::new(&[0, 1, 0, 0]).count(16, "groups"),
            Err(XdrError::TooLong {
                what: "groups",
                len: 65536,
                max: 16
            })
        );
    }
}
