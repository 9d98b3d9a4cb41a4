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
    let mut w = Writer { dst, at: 0 };
    w.put(&u32::try_from(map.len()).ok()?.to_le_bytes())?;
    for (k, v) in map {
        w.put(&u32::try_from(k.len()).ok()?.to_le_bytes())?;
        w.put(&u32::try_from(v.len()).ok()?.to_le_bytes())?;
    }
    for (k, v) in map {
        w.put(k)?;
        w.put(&[0])?;
        w.put(v)?;
        w.put(&[0])?;
    }
    (w.at == w.dst.len()).then_some(())
}

struct Writer<'a> {
    dst: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) -> Option<()> {
        let end = self.at.checked_add(bytes.len())?;
        self.dst.get_mut(self.at..end)?.copy_from_slice(bytes);
        self.at = end;
        Some(())
    }
}

/// Size of the serialization of the `(name, value)` entries `entries` gives to the sink it is
/// called with (once); `None` if it overflows `u32`.
pub(crate) fn entries_size(entries: impl FnOnce(&mut dyn FnMut(&[u8], &[u8]))) -> Option<usize> {
    let mut size = Some(4usize);
    entries(&mut |k, v| {
        size = size
            .and_then(|s| s.checked_add(k.len()))
            .and_then(|s| s.checked_add(v.len()))
            .and_then(|s| s.checked_add(10));
    });
    let size = size?;
    u32::try_from(size).ok()?;
    Some(size)
}

/// A map serialized as it is listed, entry by entry, before its entry count is known: the
/// sizes and the names and values are kept apart ([`Pairs::push`]) and joined when copied out
/// ([`Pairs::copy_to`]). Kept and reused from call to call, it allocates only when a map is
/// larger than any before.
#[derive(Default)]
pub(crate) struct Pairs {
    count: u32,
    /// `(u32 key_len, u32 value_len)` per entry.
    sizes: Vec<u8>,
    /// Each key and value followed by a NUL.
    data: Vec<u8>,
    /// An entry count or a length past `u32`.
    overflow: bool,
}

impl Pairs {
    /// Empties it, keeping its memory.
    pub(crate) fn clear(&mut self) {
        self.count = 0;
        self.sizes.clear();
        self.data.clear();
        self.overflow = false;
    }

    /// Appends an entry, its name written ASCII lower-case (as a built map's names are).
    pub(crate) fn push(&mut self, name: &[u8], value: &[u8]) {
        let (Ok(k), Ok(v), Some(count)) = (
            u32::try_from(name.len()),
            u32::try_from(value.len()),
            self.count.checked_add(1),
        ) else {
            self.overflow = true;
            return;
        };
        self.count = count;
        self.sizes.extend_from_slice(&k.to_le_bytes());
        self.sizes.extend_from_slice(&v.to_le_bytes());
        let at = self.data.len();
        self.data.extend_from_slice(name);
        if let Some(name) = self.data.get_mut(at..) {
            name.make_ascii_lowercase();
        }
        self.data.push(0);
        self.data.extend_from_slice(value);
        self.data.push(0);
    }

    /// The size of the serialization (bytes); `None` past `u32::MAX`.
    pub(crate) fn size(&self) -> Option<usize> {
        if self.overflow {
            return None;
        }
        let size = self
            .sizes
            .len()
            .checked_add(self.data.len())?
            .checked_add(4)?;
        u32::try_from(size).ok()?;
        Some(size)
    }

    /// Writes the serialization into `dst`; `None` unless `dst` is exactly [`Pairs::size`] long.
    pub(crate) fn copy_to(&self, dst: &mut [u8]) -> Option<()> {
        if Some(dst.len()) != self.size() {
            return None;
        }
        let mut w = Writer { dst, at: 0 };
        w.put(&self.count.to_le_bytes())?;
        w.put(&self.sizes)?;
        w.put(&self.data)
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
    fn pairs_serialize_as_the_built_map_and_are_reused() {
        let map: HeaderMap = vec![(b"a".to_vec(), b"1".to_vec()), (b"bb".to_vec(), Vec::new())];
        let mut want = vec![0u8; serialized_size(&map).unwrap()];
        serialize_into(&map, &mut want).unwrap();
        let mut pairs = Pairs::default();
        for _ in 0..2 {
            pairs.clear();
            pairs.push(b"A", b"1");
            pairs.push(b"bB", b"");
            assert_eq!(pairs.size(), Some(want.len()));
            let mut got = vec![0u8; want.len()];
            pairs.copy_to(&mut got).unwrap();
            assert_eq!(got, want);
            assert!(pairs.copy_to(&mut vec![0u8; want.len() + 1]).is_none());
        }
        pairs.clear();
        assert_eq!(pairs.size(), Some(4));
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
