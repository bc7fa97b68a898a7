//! What uploads wrote into a simulated volume, kept without its runs of zeros. A seed image
//! is some 60 KiB of which a few KiB are not zero (ISO 9660 pads every descriptor, directory
//! and file to a 2 KiB sector, after 32 KiB of system area); a dry-run of thousands of VMs
//! keeps one per domain, so storing them whole was most of its memory. Reads give back the
//! same bytes, zeros included.

/// Bytes are kept in aligned blocks of this size: a block of zeros is left out, a run of
/// blocks with anything in them is kept whole. Whole blocks let the scan OR them together
/// (which the compiler vectorizes) instead of looking at every byte.
const BLOCK: usize = 64;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bytes {
    len: usize,
    /// Non-overlapping, in order: (offset, bytes). Everything else below `len` is zero.
    extents: Vec<(usize, Box<[u8]>)>,
}

impl Bytes {
    pub fn new(data: &[u8]) -> Self {
        let mut extents = Vec::new();
        let mut start = None;
        for (i, block) in data.chunks(BLOCK).enumerate() {
            let at = i * BLOCK;
            let zero = block.iter().fold(0u8, |acc, b| acc | b) == 0;
            match (zero, start) {
                (false, None) => start = Some(at),
                (true, Some(s)) => {
                    extents.push((s, data[s..at].into()));
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(s) = start {
            extents.push((s, data[s..].into()));
        }
        Self {
            len: data.len(),
            extents,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first `n` bytes (fewer when shorter).
    pub fn prefix(&self, n: usize) -> Vec<u8> {
        let n = n.min(self.len);
        let mut out = vec![0u8; n];
        for (offset, bytes) in &self.extents {
            if *offset >= n {
                break;
            }
            let take = bytes.len().min(n - offset);
            out[*offset..offset + take].copy_from_slice(&bytes[..take]);
        }
        out
    }

    pub fn to_vec(&self) -> Vec<u8> {
        self.prefix(self.len)
    }

    /// Writes `data` from offset 0 and keeps what lay past its end, as a stream written into
    /// an existing volume does (libvirt never truncates).
    pub fn overwrite_from_start(&mut self, data: &[u8]) {
        let written = data.len();
        let mut next = Self::new(data);
        for (offset, bytes) in std::mem::take(&mut self.extents) {
            let end = offset + bytes.len();
            if end <= written {
                continue;
            }
            let skip = written.saturating_sub(offset);
            next.extents.push((offset + skip, bytes[skip..].into()));
        }
        next.len = written.max(self.len);
        *self = next;
    }

    pub fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        // Bursts of bytes between zero runs of every length around BLOCK.
        let mut v = vec![0u8; len];
        let mut at = 0;
        let mut k = u32::from(seed);
        while at < len {
            k = k.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let burst = (k >> 8) as usize % 40;
            let gap = (k >> 16) as usize % (2 * BLOCK + 3);
            v[at..(at + burst).min(len)].fill((k >> 24) as u8 | 1);
            at += burst + gap;
        }
        v
    }

    #[test]
    fn reads_give_back_what_was_written() {
        for len in [0, 1, 63, 64, 65, 2048, 61_440] {
            for seed in 0..8 {
                let data = pattern(len, seed);
                let b = Bytes::new(&data);
                assert_eq!(b.to_vec(), data, "len {len} seed {seed}");
                assert_eq!(b.len(), len);
                for n in [0, 1, len / 3, len, len + 10] {
                    assert_eq!(b.prefix(n), data[..n.min(len)].to_vec());
                }
            }
        }
        let zeros = Bytes::new(&[0; 4096]);
        assert!(zeros.extents.is_empty());
        assert_eq!(zeros.to_vec(), vec![0; 4096]);
    }

    #[test]
    fn an_overwrite_keeps_the_tail_past_its_end() {
        for (old_len, new_len) in [(100, 40), (5000, 4999), (300, 300), (10, 500), (0, 7)] {
            let old = pattern(old_len, 3);
            let new = pattern(new_len, 5);
            let mut b = Bytes::new(&old);
            b.overwrite_from_start(&new);
            let mut want = new.clone();
            if old.len() > new.len() {
                want.extend_from_slice(&old[new.len()..]);
            }
            assert_eq!(b.to_vec(), want, "{old_len} then {new_len}");
        }
    }

    #[test]
    fn a_seed_image_keeps_a_fraction_of_its_size() {
        // 30 sectors, each with a little at its start, as descriptors and directories have.
        let mut iso = vec![0u8; 30 * 2048];
        for s in 16..30 {
            iso[s * 2048..s * 2048 + 200].fill(7);
        }
        let b = Bytes::new(&iso);
        let kept: usize = b.extents.iter().map(|(_, e)| e.len()).sum();
        assert!(kept <= 14 * 256, "{kept}");
    }
}
