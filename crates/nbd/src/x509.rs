//! The one thing the server reads from a client certificate: the common name (CN) of its subject,
//! which the export allow-list is keyed by. rustls has verified the certificate against the
//! configured CA before we see it, but the DER is still parsed with every length checked, so a
//! malformed certificate yields no name rather than a panic.
//!
//! Layout (RFC 5280, section 4.1): Certificate ::= SEQUENCE { tbsCertificate SEQUENCE {
//! [0] version OPTIONAL, serialNumber INTEGER, signature SEQUENCE, issuer Name, validity
//! SEQUENCE, subject Name, ... }, ... }; Name ::= SEQUENCE OF SET OF SEQUENCE { type OID,
//! value ANY }.

const TAG_SEQUENCE: u8 = 0x30;
const TAG_SET: u8 = 0x31;
const TAG_OID: u8 = 0x06;
const TAG_INTEGER: u8 = 0x02;
const TAG_VERSION: u8 = 0xa0;
const TAG_UTF8_STRING: u8 = 0x0c;
const TAG_PRINTABLE_STRING: u8 = 0x13;
const TAG_IA5_STRING: u8 = 0x16;
/// id-at-commonName, 2.5.4.3.
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

/// The subject's common name, when the certificate has exactly one, as a UTF-8, printable or
/// IA5 string. A certificate with two CNs gets no name: which one an allow-list entry meant
/// would be a guess.
pub(crate) fn subject_common_name(certificate_der: &[u8]) -> Option<String> {
    let certificate = Der::new(certificate_der).expect_tlv(TAG_SEQUENCE)?;
    let mut tbs = Der::new(certificate)
        .expect_tlv(TAG_SEQUENCE)
        .map(Der::new)?;
    if tbs.peek_tag() == Some(TAG_VERSION) {
        tbs.any_tlv()?;
    }
    tbs.expect_tlv(TAG_INTEGER)?; // serialNumber
    tbs.expect_tlv(TAG_SEQUENCE)?; // signature algorithm
    tbs.expect_tlv(TAG_SEQUENCE)?; // issuer
    tbs.expect_tlv(TAG_SEQUENCE)?; // validity
    let mut subject = Der::new(tbs.expect_tlv(TAG_SEQUENCE)?);

    let mut found = None;
    while !subject.is_empty() {
        let mut rdn = Der::new(subject.expect_tlv(TAG_SET)?);
        while !rdn.is_empty() {
            let mut attribute = Der::new(rdn.expect_tlv(TAG_SEQUENCE)?);
            let oid = attribute.expect_tlv(TAG_OID)?;
            let (tag, value) = attribute.any_tlv()?;
            if oid != OID_COMMON_NAME {
                continue;
            }
            if found.is_some() {
                return None;
            }
            let text = match tag {
                TAG_UTF8_STRING => std::str::from_utf8(value).ok()?,
                TAG_PRINTABLE_STRING | TAG_IA5_STRING if value.is_ascii() => {
                    std::str::from_utf8(value).ok()?
                }
                _ => return None,
            };
            found = Some(text.to_owned());
        }
    }
    found
}

/// A cursor over DER tag-length-value items.
struct Der<'a> {
    bytes: &'a [u8],
}

impl<'a> Der<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Der { bytes }
    }

    fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn peek_tag(&self) -> Option<u8> {
        self.bytes.first().copied()
    }

    /// The next item's tag and contents. Only the definite-length forms DER allows are
    /// accepted, with lengths of up to four bytes.
    fn any_tlv(&mut self) -> Option<(u8, &'a [u8])> {
        let (&tag, rest) = self.bytes.split_first()?;
        let (&first, rest) = rest.split_first()?;
        let (length, rest) = if first < 0x80 {
            (usize::from(first), rest)
        } else {
            let count = usize::from(first & 0x7f);
            if count == 0 || count > 4 || rest.len() < count {
                return None;
            }
            let (digits, rest) = rest.split_at(count);
            let length = digits
                .iter()
                .fold(0usize, |length, &digit| (length << 8) | usize::from(digit));
            (length, rest)
        };
        if rest.len() < length {
            return None;
        }
        let (contents, rest) = rest.split_at(length);
        self.bytes = rest;
        Some((tag, contents))
    }

    fn expect_tlv(&mut self, tag: u8) -> Option<&'a [u8]> {
        match self.any_tlv()? {
            (found, contents) if found == tag => Some(contents),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tlv(tag: u8, contents: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        if contents.len() < 0x80 {
            out.push(contents.len() as u8);
        } else {
            out.push(0x82);
            out.extend_from_slice(&(contents.len() as u16).to_be_bytes());
        }
        out.extend_from_slice(contents);
        out
    }

    fn attribute(oid: &[u8], tag: u8, value: &[u8]) -> Vec<u8> {
        let mut contents = tlv(TAG_OID, oid);
        contents.extend(tlv(tag, value));
        tlv(TAG_SET, &tlv(TAG_SEQUENCE, &contents))
    }

    /// A certificate skeleton around `subject` (the RDNs, concatenated).
    fn certificate(subject: &[u8], with_version: bool) -> Vec<u8> {
        let mut tbs = Vec::new();
        if with_version {
            tbs.extend(tlv(TAG_VERSION, &tlv(TAG_INTEGER, &[2])));
        }
        tbs.extend(tlv(TAG_INTEGER, &[0x01, 0x02]));
        tbs.extend(tlv(TAG_SEQUENCE, &[0x06, 0x01, 0x2a]));
        tbs.extend(tlv(
            TAG_SEQUENCE,
            &attribute(OID_COMMON_NAME, TAG_UTF8_STRING, b"ca"),
        ));
        tbs.extend(tlv(TAG_SEQUENCE, &[0x17, 0x00, 0x17, 0x00]));
        tbs.extend(tlv(TAG_SEQUENCE, subject));
        tbs.extend(tlv(TAG_SEQUENCE, &[0; 200])); // a long public key: a two-byte length
        let mut certificate = tlv(TAG_SEQUENCE, &tbs);
        certificate.extend(tlv(TAG_SEQUENCE, &[0x06, 0x01, 0x2a]));
        tlv(TAG_SEQUENCE, &certificate)
    }

    const OID_ORGANIZATION: &[u8] = &[0x55, 0x04, 0x0a];

    #[test]
    fn finds_the_subject_cn_not_the_issuer_cn() {
        let mut subject = attribute(OID_ORGANIZATION, TAG_UTF8_STRING, b"bucketfs");
        subject.extend(attribute(OID_COMMON_NAME, TAG_PRINTABLE_STRING, b"alice"));
        for with_version in [true, false] {
            assert_eq!(
                subject_common_name(&certificate(&subject, with_version)).as_deref(),
                Some("alice")
            );
        }
        let utf8 = attribute(OID_COMMON_NAME, TAG_UTF8_STRING, "jürgen".as_bytes());
        assert_eq!(
            subject_common_name(&certificate(&utf8, true)).as_deref(),
            Some("jürgen")
        );
    }

    #[test]
    fn no_cn_two_cns_or_odd_strings_give_no_name() {
        let none = attribute(OID_ORGANIZATION, TAG_UTF8_STRING, b"bucketfs");
        assert_eq!(subject_common_name(&certificate(&none, true)), None);
        let mut two = attribute(OID_COMMON_NAME, TAG_UTF8_STRING, b"alice");
        two.extend(attribute(OID_COMMON_NAME, TAG_UTF8_STRING, b"bob"));
        assert_eq!(subject_common_name(&certificate(&two, true)), None);
        let bmp = attribute(OID_COMMON_NAME, 0x1e, &[0, b'a']);
        assert_eq!(subject_common_name(&certificate(&bmp, true)), None);
        let bad_utf8 = attribute(OID_COMMON_NAME, TAG_UTF8_STRING, &[0xff, 0xfe]);
        assert_eq!(subject_common_name(&certificate(&bad_utf8, true)), None);
    }

    #[test]
    fn truncated_or_malformed_der_gives_no_name() {
        let subject = attribute(OID_COMMON_NAME, TAG_UTF8_STRING, b"alice");
        let good = certificate(&subject, true);
        assert!(subject_common_name(&good).is_some());
        for cut in 0..good.len() {
            assert_eq!(subject_common_name(&good[..cut]), None, "cut at {cut}");
        }
        // Indefinite length, and a length of five bytes.
        assert_eq!(subject_common_name(&[0x30, 0x80, 0x00, 0x00]), None);
        assert_eq!(subject_common_name(&[0x30, 0x85, 1, 0, 0, 0, 0]), None);
        assert_eq!(subject_common_name(&[]), None);
    }
}
