//! Bounds-checked access to guest memory (wasm32: pointers and sizes are `u32`), and the
//! proxy-wasm map serialization (spec: "Serialization of header maps"): a `u32` count, then a
//! `(u32 key_len, u32 value_len)` pair per entry, then each key and value followed by a NUL.
//! All integers little-endian.

use crate::header_map::HeaderMap;

/// `len` bytes at `ptr`, or `None` when out of bounds. A zero length is always valid (Rust
/// passes dangling non-null pointers for empty slices, the SDKs null ones).
pub(crate) fn slice(mem: &[u8], ptr: u32, len: u32) -> Option<&[u8]> {
    if len == 0 {
        return Some(&[]);
    }
    let start = usize::try_from(ptr).ok()?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    mem.get(start..end)
}

/// Mutable `len` bytes at `ptr`, or `None` when out of bounds.
pub(crate) fn slice_mut(mem: &mut [u8], ptr: u32, len: usize) -> Option<&mut [u8]> {
    if len == 0 {
        return Some(&mut []);
    }
    let start = usize::try_from(ptr).ok()?;
    let end = start.checked_add(len)?;
    mem.get_mut(start..end)
}

/// Writes `bytes` at `ptr`; false when out of bounds.
pub(crate) fn write(mem: &mut [u8], ptr: u32, bytes: &[u8]) -> bool {
    match slice_mut(mem, ptr, bytes.len()) {
        Some(dst) => {
            dst.copy_from_slice(bytes);
            true
        }
        None => false,
    }
}

/// Copies `src` into `dst` when they have the same length; `None` otherwise (a host function
/// measured `src`, then the guest's allocator ran and changed it).
pub(crate) fn copy(dst: &mut [u8], src: &[u8]) -> Option<()> {
    if dst.len() != src.len() {
        return None;
    }
    dst.copy_from_slice(src);
    Some(())
}

pub(crate) fn write_u32(mem: &mut [u8], ptr: u32, v: u32) -> bool {
    write(mem, ptr, &v.to_le_bytes())
}

pub(crate) fn read_u32(mem: &[u8], ptr: u32) -> Option<u32> {
    let b = slice(mem, ptr, 4)?;
    let a: [u8; 4] = b.try_into().ok()?;
    Some(u32::from_le_bytes(a))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<usize> {
    let end = at.checked_add(4)?;
    let a: [u8; 4] = bytes.get(at..end)?.try_into().ok()?;
    usize::try_from(u32::from_le_bytes(a)).ok()
}

/// Size of the serialized `map`, or `None` if it overflows `u32`.
pub(crate) fn serialized_size(map: &HeaderMap) -> Option<usize> {
    let mut size: usize = 4;
    for (k, v) in map {
        size = size
            .checked_add(k.len())?
            .checked_add(v.len())?
            .checked_add(10)?;
    }
    u32::try_from(size).ok()?;
    Some(size)
}

/// Serializes `map` into `dst`; `None` unless `dst` is exactly `serialized_size(map)` long.
pub(crate) fn serialize_into(map: &HeaderMap, dst: &mut [u8]) -> Option<()> {
    serialize_entries(dst, map.len(), false, |sink| {
        for (k, v) in map {
            sink(k, v);
        }
    })
}

/// The entry count and the size (bytes) of the serialization of the `(name, value)` entries
/// `entries` gives to the sink it is called with (once); `None` if the size overflows `u32`.
pub(crate) fn entries_size(
    entries: impl FnOnce(&mut dyn FnMut(&[u8], &[u8])),
) -> Option<(usize, usize)> {
    let mut count = 0usize;
    let mut size = Some(4usize);
    entries(&mut |k, v| {
        count = count.saturating_add(1);
        size = size
            .and_then(|s| s.checked_add(k.len()))
            .and_then(|s| s.checked_add(v.len()))
            .and_then(|s| s.checked_add(10));
    });
    let size = size?;
    u32::try_from(size).ok()?;
    Some((count, size))
}

/// Serializes a map of `count` entries into `dst` in one pass, without building it: `entries`
/// is called once with a sink that takes each `(name, value)` in order, its sizes written at
/// the front and its bytes after them; `lower` writes the names ASCII lower-case (as a built
/// map's are). `None` unless exactly `count` entries came and they fill `dst` exactly (the
/// size [`entries_size`] gives for the same entries); `dst` is then partly written.
pub(crate) fn serialize_entries(
    dst: &mut [u8],
    count: usize,
    lower: bool,
    entries: impl FnOnce(&mut dyn FnMut(&[u8], &[u8])),
) -> Option<()> {
    let mut sizes = Writer { dst, at: 0 };
    sizes.put(&u32::try_from(count).ok()?.to_le_bytes())?;
    let (sizes, data) = sizes
        .dst
        .split_at_mut_checked(count.checked_mul(8)?.checked_add(4)?)?;
    let mut sizes = Writer { dst: sizes, at: 4 };
    let mut data = Writer { dst: data, at: 0 };
    let mut left = Some(count);
    entries(&mut |k, v| {
        // After a failure (or one entry too many) the rest is skipped and `left` stays `None`.
        left = left.and_then(|n| n.checked_sub(1)).and_then(|n| {
            sizes.put(&u32::try_from(k.len()).ok()?.to_le_bytes())?;
            sizes.put(&u32::try_from(v.len()).ok()?.to_le_bytes())?;
            let name = data.put(k)?;
            if lower {
                name.make_ascii_lowercase();
            }
            data.put(&[0])?;
            data.put(v)?;
            data.put(&[0])?;
            Some(n)
        });
    });
    (left == Some(0) && sizes.at == sizes.dst.len() && data.at == data.dst.len()).then_some(())
}

struct Writer<'a> {
    dst: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    /// Copies `bytes` at the write position and moves past them; the copy, to change in place.
    fn put(&mut self, bytes: &[u8]) -> Option<&mut [u8]> {
        let end = self.at.checked_add(bytes.len())?;
        let dst = self.dst.get_mut(self.at..end)?;
        dst.copy_from_slice(bytes);
        self.at = end;
        Some(dst)
    }
}

/// Parses a serialized map; `lower` lower-cases the keys (header names). `None` when
/// malformed (sizes past the end, missing NUL terminators). An empty buffer is an empty map.
pub(crate) fn deserialize(bytes: &[u8], lower: bool) -> Option<HeaderMap> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let n = u32_at(bytes, 0)?;
    // Each entry needs at least 8 bytes of sizes and 2 NULs: bound the allocation by the input.
    if n > bytes.len() / 10 {
        return None;
    }
    let mut map = Vec::with_capacity(n);
    let mut data = n.checked_mul(8)?.checked_add(4)?;
    let mut sizes = 4usize;
    for _ in 0..n {
        let klen = u32_at(bytes, sizes)?;
        let vlen = u32_at(bytes, sizes.checked_add(4)?)?;
        sizes = sizes.checked_add(8)?;
        let kend = data.checked_add(klen)?;
        let key = bytes.get(data..kend)?;
        if *bytes.get(kend)? != 0 {
            return None;
        }
        data = kend.checked_add(1)?;
        let vend = data.checked_add(vlen)?;
        let value = bytes.get(data..vend)?;
        if *bytes.get(vend)? != 0 {
            return None;
        }
        data = vend.checked_add(1)?;
        let key = if lower {
            key.to_ascii_lowercase()
        } else {
            key.to_vec()
        };
        map.push((key, value.to_vec()));
    }
    Some(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let map: HeaderMap = vec![(b"a".to_vec(), b"1".to_vec()), (b"bb".to_vec(), Vec::new())];
        let size = serialized_size(&map).unwrap();
        let mut buf = vec![0u8; size];
        serialize_into(&map, &mut buf).unwrap();
        assert_eq!(deserialize(&buf, true).unwrap(), map);
        assert!(deserialize(&buf[..buf.len() - 1], true).is_none());
        let mut bad = buf.clone();
        bad[0] = 200;
        assert!(deserialize(&bad, true).is_none());
    }

    #[test]
    fn bounds() {
        let mem = [0u8; 16];
        assert!(slice(&mem, 12, 4).is_some());
        assert!(slice(&mem, 13, 4).is_none());
        assert!(slice(&mem, u32::MAX, 2).is_none());
        assert_eq!(slice(&mem, u32::MAX, 0), Some(&[][..]));
    }
}
