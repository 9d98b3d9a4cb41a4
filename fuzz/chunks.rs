//! Cutting a fuzz input into chunks, for targets that check that a streaming reader gives the
//! same result whatever the chunks (included with `#[path]`, so it is not a target itself).

/// `data` cut into pieces whose lengths cycle through the bits of `seed` (1 to 28 bytes).
pub fn chunks(data: &[u8], seed: u8) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let (mut at, mut i) = (0usize, 0u32);
    while at < data.len() {
        let len = 1 + usize::from(seed.rotate_left(i) % 7) * (1 + usize::from(seed >> 6));
        let end = (at + len).min(data.len());
        out.push(&data[at..end]);
        at = end;
        i += 1;
    }
    out
}
