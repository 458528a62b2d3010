//! Compression: sniffing and decoding archives, and encoding dumps.
//!
//! gzip decoding uses flate2 on the zlib-rs backend and accepts
//! multi-member streams; gzip encoding is block-parallel (gzp, pigz style,
//! one gzip member any reader accepts); zstd uses the zstd library, with its
//! own worker threads for encoding.

use std::io::{self, BufRead, BufReader, Read, Write};

use gzp::ZWriter;
use gzp::deflate::Gzip;
use gzp::par::compress::{ParCompress, ParCompressBuilder};

/// How an archive is compressed. The workspace's own type: the gRPC
/// adapter maps the wire enum onto it, so this module needs no proto.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// Initialize: sniff gzip or zstd magic bytes, else plain tar. Dump: gzip.
    #[default]
    Auto,
    Gzip,
    Zstd,
    /// Plain, uncompressed tar.
    None,
}

/// zstd multithreaded job size (bytes of input per worker job).
pub const ZSTD_JOB_BYTES: u32 = 1 << 20;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Resolves `Auto` by looking at the first bytes of the stream.
pub fn sniff<R: BufRead>(r: &mut R, requested: Compression) -> io::Result<Compression> {
    if requested != Compression::Auto {
        return Ok(requested);
    }
    let head = r.fill_buf()?;
    Ok(if head.starts_with(&GZIP_MAGIC) {
        Compression::Gzip
    } else if head.starts_with(&ZSTD_MAGIC) {
        Compression::Zstd
    } else {
        Compression::None
    })
}

/// Size of a tar header block.
const TAR_BLOCK: usize = 512;

/// Checks that a stream sniffed as neither gzip nor zstd starts like a tar
/// archive (a `ustar` header, or an old-style header with a valid checksum,
/// or the all-zero end block). When it does not, the message names what the
/// data looks like and what was expected; it never quotes the data.
pub fn check_plain_tar<R: BufRead>(r: &mut R) -> Result<(), String> {
    let head = r
        .fill_buf()
        .map_err(|e| format!("reading the archive: {e}"))?;
    if head.is_empty() {
        return Ok(());
    }
    let looks_like = infer::get(head)
        .filter(|t| t.mime_type() != "application/x-tar")
        .map(|t| format!("{} data ({})", t.extension(), t.mime_type()));
    if let Some(block) = head.get(..TAR_BLOCK)
        && looks_like.is_none()
    {
        if block.iter().all(|&b| b == 0) || block.get(257..262) == Some(b"ustar".as_slice()) {
            return Ok(());
        }
        let mut h = tar::Header::new_old();
        h.as_mut_bytes().copy_from_slice(block);
        let stored = h.cksum();
        h.set_cksum();
        if stored.is_ok() && stored.ok() == h.cksum().ok() {
            return Ok(());
        }
    } else if looks_like.is_none() {
        // Too short to judge here; the tar reader decides.
        return Ok(());
    }
    Err(format!(
        "not an archive this agent reads: the data is {}; expected a tar archive, \
         gzip-compressed (starts with 1f 8b), zstd-compressed (28 b5 2f fd) or plain \
         (a ustar header)",
        looks_like.as_deref().unwrap_or("not a tar header")
    ))
}

/// Largest zstd window a stream may ask the decoder to allocate: 2^27 =
/// 128 MiB, libzstd's own default, stated here because it is the largest
/// part of an extraction's memory bound. `zstd --long=31` streams are
/// refused (the `zstd` CLI refuses them too without `--memory`).
pub const ZSTD_WINDOW_LOG_MAX: u32 = 27;

/// A decompressing reader over `r`.
pub fn decoder<'a, R: BufRead + 'a>(r: R, c: Compression) -> io::Result<Box<dyn Read + 'a>> {
    Ok(match c {
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(r)),
        Compression::Zstd => {
            let mut d = zstd::stream::read::Decoder::with_buffer(r)?;
            d.window_log_max(ZSTD_WINDOW_LOG_MAX)?;
            Box::new(d)
        }
        Compression::None | Compression::Auto => Box::new(r),
    })
}

/// A compressing writer; [`Encoder::finish`] writes the trailer and returns
/// the inner writer.
pub enum Encoder<W: Write + Send + 'static> {
    Gzip(ParCompress<'static, Gzip, W>),
    Zstd(zstd::stream::write::Encoder<'static, W>),
    None(W),
}

impl<W: Write + Send + 'static> Encoder<W> {
    /// `level` 0 means the codec default (gzip 6, zstd 3). `threads` 0 means
    /// one per CPU.
    pub fn new(w: W, c: Compression, level: i32, threads: usize) -> io::Result<Encoder<W>> {
        let threads = if threads == 0 {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        } else {
            threads
        };
        Ok(match c {
            Compression::Gzip | Compression::Auto => {
                let level = if level == 0 { 6 } else { level };
                if !(1..=9).contains(&level) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("gzip level must be 1..=9, got {level}"),
                    ));
                }
                let b = ParCompressBuilder::<Gzip>::new()
                    .num_threads(threads)
                    .map_err(io::Error::other)?
                    .compression_level(flate2::Compression::new(level as u32));
                Encoder::Gzip(b.from_writer(w))
            }
            Compression::Zstd => {
                let level = if level == 0 { 3 } else { level };
                if !(1..=22).contains(&level) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("zstd level must be 1..=22, got {level}"),
                    ));
                }
                let mut e = zstd::stream::write::Encoder::new(w, level)?;
                if threads > 1 {
                    e.multithread(threads as u32)?;
                    // The default job is several windows long; each worker
                    // buffers its job in and out. Short jobs keep a dump's
                    // memory near 16 MiB at the default level (78 MiB
                    // measured without this) for a ~1% larger output.
                    e.set_parameter(zstd::stream::raw::CParameter::JobSize(ZSTD_JOB_BYTES))?;
                }
                Encoder::Zstd(e)
            }
            Compression::None => Encoder::None(w),
        })
    }

    pub fn finish(self) -> io::Result<W> {
        match self {
            Encoder::Gzip(mut g) => g.finish().map_err(io::Error::other),
            Encoder::Zstd(z) => z.finish(),
            Encoder::None(w) => Ok(w),
        }
    }
}

impl<W: Write + Send + 'static> Write for Encoder<W> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Encoder::Gzip(g) => g.write(b),
            Encoder::Zstd(z) => z.write(b),
            Encoder::None(w) => w.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Encoder::Gzip(g) => g.flush(),
            Encoder::Zstd(z) => z.flush(),
            Encoder::None(w) => w.flush(),
        }
    }
}

/// Buffered reader of the size the decoders work best with.
pub fn buffered<R: Read>(r: R) -> BufReader<R> {
    BufReader::with_capacity(256 << 10, r)
}

#[cfg(test)]
mod tests {
    use super::check_plain_tar;

    fn check(data: &[u8]) -> Result<(), String> {
        check_plain_tar(&mut std::io::BufReader::new(data))
    }

    /// A zstd frame that asks for a window over 2^27 bytes (`zstd
    /// --long=31` on a stream) is refused before the decoder allocates it.
    #[test]
    fn zstd_windows_over_the_limit_are_refused() {
        use std::io::{Read, Write};
        let frame = |log: u32| {
            let mut e = zstd::stream::write::Encoder::new(Vec::new(), 1).expect("encoder");
            e.long_distance_matching(true).expect("ldm");
            e.window_log(log).expect("window");
            e.write_all(&[7u8; 4096]).expect("data");
            e.finish().expect("finish")
        };
        let read = |data: Vec<u8>| {
            let mut out = Vec::new();
            super::decoder(std::io::BufReader::new(&data[..]), super::Compression::Zstd)
                .and_then(|mut d| d.read_to_end(&mut out))
                .map(|_| out.len())
        };
        assert_eq!(
            read(frame(super::ZSTD_WINDOW_LOG_MAX)).expect("within"),
            4096
        );
        let e = read(frame(31)).expect_err("a 2 GiB window");
        assert!(e.to_string().contains("memory"), "{e}");
    }

    #[test]
    fn tar_headers_pass_and_other_formats_are_named() {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(3);
        h.set_cksum();
        b.append_data(&mut h, "a.txt", &b"abc"[..]).unwrap();
        let gnu = b.into_inner().unwrap();
        assert_eq!(check(&gnu), Ok(()));
        let mut old = tar::Header::new_old();
        old.set_path("x").unwrap();
        old.set_cksum();
        assert_eq!(check(old.as_bytes()), Ok(()));
        assert_eq!(check(&[0u8; 1024]), Ok(()));
        assert_eq!(check(b""), Ok(()));

        let mut zip = b"PK\x03\x04".to_vec();
        zip.resize(600, 7);
        let e = check(&zip).unwrap_err();
        assert!(e.contains("zip") && e.contains("gzip"), "{e}");
        let text = "hello, this is not an archive\n".repeat(30);
        let e = check(text.as_bytes()).unwrap_err();
        assert!(
            e.contains("not a tar header") && !e.contains("hello"),
            "{e}"
        );
    }
}
