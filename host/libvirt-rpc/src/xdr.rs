//! XDR (RFC 4506) encoding and decoding, as much of it as libvirt's protocol uses.
//!
//! Every item is a multiple of four bytes, big-endian. Decoding never panics: every read checks
//! the remaining length first, and every variable-length item is checked against its declared
//! maximum before anything is allocated for it.

use thiserror::Error;

/// Why a byte sequence is not a valid encoding of the expected value.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum XdrError {
    #[error("truncated: needed {needed} more bytes, {available} left")]
    Truncated { needed: usize, available: usize },
    #[error("length {len} exceeds the limit {max}")]
    TooLong { len: usize, max: usize },
    #[error("string is not UTF-8")]
    InvalidUtf8,
    #[error("invalid boolean {0}")]
    InvalidBool(u32),
    #[error("invalid value {value} for {what}")]
    InvalidEnum { what: &'static str, value: i32 },
    #[error("{0} bytes left over after the value")]
    Trailing(usize),
}

/// Rounds a byte count up to the next multiple of four (XDR's unit).
fn padded(len: usize) -> usize {
    len.div_ceil(4) * 4
}

/// Appends XDR items to a growable buffer.
#[derive(Debug, Default)]
pub struct Encoder {
    buf: Vec<u8>,
}

impl Encoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_buffer(buf: Vec<u8>) -> Self {
        Self { buf }
    }

    pub fn into_inner(self) -> Vec<u8> {
        self.buf
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn put_u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub fn put_i32(&mut self, v: i32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub fn put_u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub fn put_i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    /// Bytes with no length word and no padding (stream data is not XDR-wrapped).
    pub fn put_raw(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    pub fn put_bool(&mut self, v: bool) {
        self.put_u32(u32::from(v));
    }

    /// Fixed-length opaque data: the bytes, zero-padded to four.
    pub fn put_fixed_opaque(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        self.buf.resize(padded(self.buf.len()), 0);
    }

    /// Variable-length opaque data: a length word, then the padded bytes.
    ///
    /// Lengths beyond `u32::MAX` cannot be expressed; callers keep payloads far below that
    /// (the whole message is capped at 32 MiB), so saturating here only guards the type.
    pub fn put_opaque(&mut self, bytes: &[u8]) {
        self.put_u32(u32::try_from(bytes.len()).unwrap_or(u32::MAX));
        self.put_fixed_opaque(bytes);
    }

    pub fn put_string(&mut self, s: &str) {
        self.put_opaque(s.as_bytes());
    }

    /// An optional value (`T *` in XDR): a boolean, then the value when present.
    pub fn put_option<T>(&mut self, v: Option<&T>, put: impl FnOnce(&mut Self, &T)) {
        match v {
            Some(inner) => {
                self.put_bool(true);
                put(self, inner);
            }
            None => self.put_bool(false),
        }
    }

    pub fn put_optional_string(&mut self, v: Option<&str>) {
        match v {
            Some(s) => {
                self.put_bool(true);
                self.put_string(s);
            }
            None => self.put_bool(false),
        }
    }

    pub fn put<T: XdrEncode + ?Sized>(&mut self, v: &T) {
        v.encode(self);
    }
}

/// Reads XDR items from a byte slice, front to back.
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    rest: &'a [u8],
}

impl<'a> Decoder<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    pub fn remaining(&self) -> usize {
        self.rest.len()
    }

    /// Fails unless every byte was consumed: trailing bytes mean the layout was misread.
    pub fn finish(&self) -> Result<(), XdrError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(XdrError::Trailing(self.rest.len()))
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], XdrError> {
        if n > self.rest.len() {
            return Err(XdrError::Truncated {
                needed: n,
                available: self.rest.len(),
            });
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], XdrError> {
        let bytes = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub fn get_u32(&mut self) -> Result<u32, XdrError> {
        Ok(u32::from_be_bytes(self.take_array::<4>()?))
    }

    pub fn get_i32(&mut self) -> Result<i32, XdrError> {
        Ok(i32::from_be_bytes(self.take_array::<4>()?))
    }

    pub fn get_u64(&mut self) -> Result<u64, XdrError> {
        Ok(u64::from_be_bytes(self.take_array::<8>()?))
    }

    pub fn get_i64(&mut self) -> Result<i64, XdrError> {
        Ok(i64::from_be_bytes(self.take_array::<8>()?))
    }

    pub fn get_bool(&mut self) -> Result<bool, XdrError> {
        match self.get_u32()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(XdrError::InvalidBool(other)),
        }
    }

    /// Fixed-length opaque data of `len` bytes (and its padding).
    pub fn get_fixed_opaque(&mut self, len: usize) -> Result<&'a [u8], XdrError> {
        let with_pad = self.take(padded(len))?;
        Ok(&with_pad[..len])
    }

    /// Variable-length opaque data, refused before any copy when longer than `max`.
    pub fn get_opaque(&mut self, max: usize) -> Result<&'a [u8], XdrError> {
        let len = self.get_u32()? as usize;
        if len > max {
            return Err(XdrError::TooLong { len, max });
        }
        self.get_fixed_opaque(len)
    }

    pub fn get_string(&mut self, max: usize) -> Result<String, XdrError> {
        let bytes = self.get_opaque(max)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| XdrError::InvalidUtf8)
    }

    pub fn get_option<T>(
        &mut self,
        get: impl FnOnce(&mut Self) -> Result<T, XdrError>,
    ) -> Result<Option<T>, XdrError> {
        if self.get_bool()? {
            get(self).map(Some)
        } else {
            Ok(None)
        }
    }

    pub fn get_optional_string(&mut self, max: usize) -> Result<Option<String>, XdrError> {
        self.get_option(|d| d.get_string(max))
    }

    /// A variable-length array of at most `max` items. The count is also checked against the
    /// bytes left (every item takes at least four), so a forged count allocates nothing.
    pub fn get_array<T>(
        &mut self,
        max: usize,
        mut get: impl FnMut(&mut Self) -> Result<T, XdrError>,
    ) -> Result<Vec<T>, XdrError> {
        let count = self.get_u32()? as usize;
        if count > max {
            return Err(XdrError::TooLong { len: count, max });
        }
        if count.saturating_mul(4) > self.rest.len() {
            return Err(XdrError::Truncated {
                needed: count.saturating_mul(4),
                available: self.rest.len(),
            });
        }
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            out.push(get(self)?);
        }
        Ok(out)
    }

    pub fn get<T: XdrDecode>(&mut self) -> Result<T, XdrError> {
        T::decode(self)
    }
}

/// A value with an XDR encoding.
pub trait XdrEncode {
    fn encode(&self, enc: &mut Encoder);

    fn to_xdr(&self) -> Vec<u8> {
        let mut enc = Encoder::new();
        self.encode(&mut enc);
        enc.into_inner()
    }
}

/// A value decodable from XDR.
pub trait XdrDecode: Sized {
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError>;

    /// Decodes a whole buffer, refusing leftovers.
    fn from_xdr(bytes: &[u8]) -> Result<Self, XdrError> {
        let mut dec = Decoder::new(bytes);
        let v = Self::decode(&mut dec)?;
        dec.finish()?;
        Ok(v)
    }
}

/// The empty argument or result of procedures that take or return nothing.
impl XdrEncode for () {
    fn encode(&self, _enc: &mut Encoder) {}
}

impl XdrDecode for () {
    fn decode(_dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn integers_are_big_endian() {
        let mut e = Encoder::new();
        e.put_u32(0x0102_0304);
        e.put_i32(-2);
        e.put_u64(0x0102_0304_0506_0708);
        e.put_i64(-1);
        e.put_bool(true);
        let b = e.into_inner();
        assert_eq!(&b[..4], &[1, 2, 3, 4]);
        assert_eq!(&b[4..8], &[0xff, 0xff, 0xff, 0xfe]);
        let mut d = Decoder::new(&b);
        assert_eq!(d.get_u32().unwrap(), 0x0102_0304);
        assert_eq!(d.get_i32().unwrap(), -2);
        assert_eq!(d.get_u64().unwrap(), 0x0102_0304_0506_0708);
        assert_eq!(d.get_i64().unwrap(), -1);
        assert!(d.get_bool().unwrap());
        d.finish().unwrap();
    }

    #[test]
    fn strings_are_padded_to_four() {
        for s in ["", "a", "ab", "abc", "abcd", "abcde"] {
            let mut e = Encoder::new();
            e.put_string(s);
            let b = e.into_inner();
            assert_eq!(b.len(), 4 + s.len().div_ceil(4) * 4, "{s:?}");
            let mut d = Decoder::new(&b);
            assert_eq!(d.get_string(16).unwrap(), s);
            d.finish().unwrap();
        }
    }

    #[test]
    fn optional_strings_round_trip() {
        let mut e = Encoder::new();
        e.put_optional_string(Some("x"));
        e.put_optional_string(None);
        let b = e.into_inner();
        let mut d = Decoder::new(&b);
        assert_eq!(d.get_optional_string(8).unwrap().as_deref(), Some("x"));
        assert_eq!(d.get_optional_string(8).unwrap(), None);
        d.finish().unwrap();
    }

    #[test]
    fn over_long_string_is_refused_before_reading() {
        let mut e = Encoder::new();
        e.put_u32(u32::MAX);
        let b = e.into_inner();
        assert!(matches!(
            Decoder::new(&b).get_string(1024),
            Err(XdrError::TooLong { .. })
        ));
    }

    #[test]
    fn forged_array_count_allocates_nothing() {
        let mut e = Encoder::new();
        e.put_u32(1000);
        let b = e.into_inner();
        let r = Decoder::new(&b).get_array(16384, |d| d.get_u32());
        assert!(matches!(r, Err(XdrError::Truncated { .. })));
    }

    #[test]
    fn truncation_and_bad_bool_are_errors() {
        assert!(Decoder::new(&[0, 0, 1]).get_u32().is_err());
        assert_eq!(
            Decoder::new(&[0, 0, 0, 2]).get_bool(),
            Err(XdrError::InvalidBool(2))
        );
        assert_eq!(
            Decoder::new(&[0, 0, 0, 0]).finish(),
            Err(XdrError::Trailing(4))
        );
        let mut bad_utf8 = Encoder::new();
        bad_utf8.put_opaque(&[0xff, 0xfe]);
        assert_eq!(
            Decoder::new(&bad_utf8.into_inner()).get_string(8),
            Err(XdrError::InvalidUtf8)
        );
    }
}
