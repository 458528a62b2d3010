//! The stream: compression sniffed, end marker, what follows it.

use super::*;

#[test]
fn gzip_and_zstd_are_sniffed() {
    let tar = Tar::new().file("f", b"compressed").bytes();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).expect("gzip");
    let zst = zstd::encode_all(&tar[..], 3).expect("zstd");
    for data in [gz.finish().expect("gzip"), zst] {
        let d = dirs();
        run(&d.ws, data).expect("extract");
        assert_eq!(fs::read(d.ws.join("f")).expect("read"), b"compressed");
    }
}

#[test]
fn an_archive_without_its_end_marker_is_truncated() {
    let full = Tar::new().file("f", b"x").bytes();
    let no_marker = full[..1024].to_vec();
    assert_invalid(
        run(&dirs().ws, no_marker),
        "the stream ends without the end-of-archive marker",
    );
    let cut = full[..300].to_vec();
    assert_invalid(run(&dirs().ws, cut), "ends inside a 512-byte tar block");
}

#[test]
fn data_after_the_end_marker_is_refused() {
    let mut two = Tar::new().file("a", b"x").bytes();
    two.extend(Tar::new().file("b", b"y").bytes());
    assert_invalid(
        run(&dirs().ws, two),
        "data after the tar end-of-archive marker",
    );
    let mut padded = Tar::new().file("a", b"x").bytes();
    padded.extend([0u8; 10240]);
    run(&dirs().ws, padded).expect("zero padding");
}

#[test]
fn data_that_is_no_tar_archive_is_named() {
    let text = "not an archive\n".repeat(100).into_bytes();
    assert_invalid(run(&dirs().ws, text), "not an archive this agent reads");
}
