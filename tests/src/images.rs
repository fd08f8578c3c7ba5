//! Real image files for attachment tests, made on the spot: [`png`] writes a valid PNG (RGB,
//! 8 bits, a diagonal gradient between two colours) of any size with stored (uncompressed)
//! deflate blocks, so its byte size is predictable (about `width * height * 3`) and every
//! decoder (a browser, a model API's) reads it.

/// CRC-32 (ISO 3309, as PNG chunks use it).
fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// Adler-32 (RFC 1950, the zlib stream's checksum).
fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &x in data {
        a = (a + u32::from(x)) % 65_521;
        b = (b + a) % 65_521;
    }
    (b << 16) | a
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let mut body = kind.to_vec();
    body.extend_from_slice(data);
    out.extend_from_slice(&body);
    out.extend_from_slice(&crc32(&body).to_be_bytes());
}

/// A `width` × `height` PNG fading from `from` to `to` (RGB) along the diagonal.
pub fn png(width: u32, height: u32, from: [u8; 3], to: [u8; 3]) -> Vec<u8> {
    let mut raw = Vec::with_capacity((width as usize * 3 + 1) * height as usize);
    let span = (width + height).max(2) - 2;
    for y in 0..height {
        raw.push(0); // filter: none
        for x in 0..width {
            let t = if span == 0 { 0.0 } else { f64::from(x + y) / f64::from(span) };
            for c in 0..3 {
                raw.push((f64::from(from[c]) + (f64::from(to[c]) - f64::from(from[c])) * t).round() as u8);
            }
        }
    }
    // zlib: header, stored blocks of at most 65,535 bytes, Adler-32.
    let mut z = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(65_535).collect();
    for (i, block) in blocks.iter().enumerate() {
        z.push(u8::from(i + 1 == blocks.len()));
        let len = block.len() as u16;
        z.extend_from_slice(&len.to_le_bytes());
        z.extend_from_slice(&(!len).to_le_bytes());
        z.extend_from_slice(block);
    }
    z.extend_from_slice(&adler32(&raw).to_be_bytes());
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::with_capacity(13);
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &z);
    chunk(&mut out, b"IEND", &[]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_and_shape() {
        assert_eq!(crc32(b"IEND"), 0xAE42_6082);
        assert_eq!(adler32(b"Wikipedia"), 0x11E6_0398);
        let p = png(4, 3, [0, 0, 0], [255, 255, 255]);
        assert!(p.starts_with(b"\x89PNG\r\n\x1a\n") && p.ends_with(&[0xAE, 0x42, 0x60, 0x82]));
        assert!(png(100, 100, [0; 3], [9; 3]).len() > 30_000);
    }
}
