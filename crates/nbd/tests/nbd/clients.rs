//! The server driven by real third-party NBD clients: nbdinfo, nbdsh, nbdcopy (libnbd) and
//! qemu-io (qemu). Each test starts its own server on 127.0.0.1:0 over the in-memory fixture.

use crate::common::{
    fixture, have_tool, start_tcp, ScratchDir, DISK_BYTES, FAILING_OFFSET, SMALL_BYTES,
};
use serde_json::Value;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Long enough for any of these clients on a loaded machine, short enough that a server hang
/// fails the test instead of wedging CI.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs a client to completion, killing it if it outlives `CLIENT_TIMEOUT`.
fn run(command: &mut Command) -> Output {
    let description = format!("{command:?}");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("cannot start {description}: {error}"));
    let started = Instant::now();
    loop {
        match child.try_wait().expect("waiting for client") {
            Some(_) => break,
            None if started.elapsed() > CLIENT_TIMEOUT => {
                let _ = child.kill();
                let output = child.wait_with_output().expect("collecting output");
                panic!(
                    "{description} hung; stdout: {} stderr: {}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    child.wait_with_output().expect("collecting output")
}

fn run_ok(command: &mut Command) -> String {
    let description = format!("{command:?}");
    let output = run(command);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{description} failed ({}); stdout: {stdout} stderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|error| panic!("not JSON ({error}): {text}"))
}

/// nbdsh is a shell script running `python3 -m nbd`; python3-libnbd installs into the
/// distribution's python, which a pyenv or virtualenv python earlier in PATH would shadow.
fn nbdsh() -> Command {
    let mut command = Command::new("nbdsh");
    let path = std::env::var("PATH").unwrap_or_default();
    command.env("PATH", format!("/usr/bin:/bin:{path}"));
    command
}

fn have_nbdsh() -> bool {
    if !have_tool("nbdinfo") {
        return false;
    }
    let works = run(nbdsh().arg("--version")).status.success();
    if !works {
        if std::env::var_os("CI").is_some() {
            panic!("nbdsh is required but does not run (install python3-libnbd)");
        }
        eprintln!("SKIPPED: nbdsh does not run (python3-libnbd missing?)");
    }
    works
}

#[test]
fn nbdinfo_lists_every_export_with_its_description() {
    if !have_tool("nbdinfo") {
        return;
    }
    let f = fixture();
    let server = start_tcp(f.exports);
    let listing = json(&run_ok(Command::new("nbdinfo").args([
        "--list",
        "--json",
        &server.uri(""),
    ])));
    let exports = listing["exports"].as_array().expect("exports array");
    let names: Vec<&str> = exports
        .iter()
        .map(|e| e["export-name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["disk0", "ro", "slow"]);
    assert_eq!(exports[0]["description"], "test disk");
    assert_eq!(exports[1]["description"], "read-only pattern");
    assert_eq!(exports[0]["export-size"], DISK_BYTES);
    assert_eq!(exports[1]["export-size"], SMALL_BYTES);
}

#[test]
fn nbdinfo_sees_every_capability_and_the_block_sizes() {
    if !have_tool("nbdinfo") {
        return;
    }
    let f = fixture();
    let server = start_tcp(f.exports);
    let info = json(&run_ok(
        Command::new("nbdinfo").args(["--json", &server.uri("disk0")]),
    ));
    assert_eq!(info["protocol"], "newstyle-fixed");
    assert_eq!(info["structured"], true);
    let export = &info["exports"][0];
    assert_eq!(export["export-name"], "disk0");
    assert_eq!(export["export-size"], DISK_BYTES);
    for flag in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_fast_zero",
        "can_cache",
        "can_multi_conn",
    ] {
        assert_eq!(export[flag], true, "{flag} in {export}");
    }
    assert_eq!(export["is_read_only"], false);
    assert_eq!(export["can_df"], false);
    assert_eq!(export["block_size_minimum"], 1);
    assert_eq!(export["block_size_preferred"], 4096);
    assert_eq!(export["block_size_maximum"], 32 * 1024 * 1024);
    assert_eq!(export["contexts"], serde_json::json!(["base:allocation"]));
}

#[test]
fn nbdinfo_sees_a_read_only_export_without_write_features() {
    if !have_tool("nbdinfo") {
        return;
    }
    let f = fixture();
    let server = start_tcp(f.exports);
    let info = json(&run_ok(
        Command::new("nbdinfo").args(["--json", &server.uri("ro")]),
    ));
    let export = &info["exports"][0];
    assert_eq!(export["is_read_only"], true);
    for flag in ["can_fua", "can_trim", "can_zero", "can_fast_zero"] {
        assert_eq!(export[flag], false, "{flag} in {export}");
    }
    assert_eq!(export["can_flush"], true);
}

#[test]
fn nbdinfo_without_a_name_gets_the_first_export() {
    if !have_tool("nbdinfo") {
        return;
    }
    let f = fixture();
    let server = start_tcp(f.exports);
    let size = run_ok(
        Command::new("nbdinfo").args(["--size", &format!("nbd://127.0.0.1:{}", server.port)]),
    );
    assert_eq!(size.trim(), DISK_BYTES.to_string());
}

#[test]
fn nbdinfo_fails_cleanly_on_an_unknown_export() {
    if !have_tool("nbdinfo") {
        return;
    }
    let f = fixture();
    let server = start_tcp(f.exports);
    let output = run(Command::new("nbdinfo").arg(server.uri("no-such-export")));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no-such-export"), "stderr: {stderr}");
    // The server is still there for the next client.
    run_ok(Command::new("nbdinfo").args(["--size", &server.uri("disk0")]));
}

#[test]
fn nbdinfo_map_shows_data_and_holes() {
    if !have_tool("nbdinfo") {
        return;
    }
    let f = fixture();
    f.disk.fill(0, &[0x5a; 65536]);
    f.disk.fill(1024 * 1024, &[1; 4096]);
    let server = start_tcp(f.exports);
    let map = json(&run_ok(Command::new("nbdinfo").args([
        "--map",
        "--json",
        &server.uri("disk0"),
    ])));
    let entries: Vec<(u64, u64, u64)> = map
        .as_array()
        .expect("map array")
        .iter()
        .map(|e| {
            let field = |name: &str| e[name].as_u64().unwrap_or_else(|| panic!("{name} in {e}"));
            (field("offset"), field("length"), field("type"))
        })
        .collect();
    // type 0 is data, 3 is hole and zero.
    assert_eq!(
        entries,
        vec![
            (0, 65536, 0),
            (65536, 1024 * 1024 - 65536, 3),
            (1024 * 1024, 4096, 0),
            (1024 * 1024 + 4096, DISK_BYTES - 1024 * 1024 - 4096, 3),
        ]
    );
}

#[test]
fn qemu_io_writes_reads_discards_zeroes_and_flushes() {
    if !have_tool("qemu-io") {
        return;
    }
    let f = fixture();
    f.disk.fill(1024 * 1024, &[0xcd; 65536]);
    f.disk.fill(2 * 1024 * 1024, &[0xef; 65536]);
    f.disk.fill(3 * 1024 * 1024, &[0xef; 65536]);
    let server = start_tcp(f.exports.clone());
    let commands = [
        "write -P 0xab 12345 7777",
        "read -P 0xab 12345 7777",
        "read -P 0 0 12345",
        "aio_write -P 0x21 4194304 65536",
        "aio_write -P 0x22 4259840 65536",
        "aio_flush",
        "read -P 0x21 4194304 65536",
        "read -P 0x22 4259840 65536",
        "discard 1048576 65536",
        "read -P 0 1048576 65536",
        "write -z 2097152 65536",
        "read -P 0 2097152 65536",
        "write -z -u 3145728 65536",
        "read -P 0 3145728 65536",
        "write -f -P 0x11 5242880 4096",
        "read -P 0x11 5242880 4096",
        "flush",
        "read -P 0 16773120 4096",
    ];
    let mut command = Command::new("qemu-io");
    command.args(["-f", "raw", &server.uri("disk0")]);
    for c in commands {
        command.args(["-c", c]);
    }
    let stdout = run_ok(&mut command);
    assert!(
        !stdout.contains("failed"),
        "qemu-io reported a failure: {stdout}"
    );
    assert_eq!(f.disk.contents(12345, 7777), vec![0xab; 7777]);
    assert!(
        !f.disk.is_allocated(1024 * 1024),
        "discard should have punched"
    );
    assert!(
        f.disk.is_allocated(2 * 1024 * 1024),
        "write -z without -u must not punch"
    );
    assert!(
        !f.disk.is_allocated(3 * 1024 * 1024),
        "write -z -u may punch"
    );
    assert!(f.disk.flushes.load(Ordering::SeqCst) >= 1);
    assert!(f.disk.fua_writes.load(Ordering::SeqCst) >= 1);
}

#[test]
fn qemu_io_sees_export_errors() {
    if !have_tool("qemu-io") {
        return;
    }
    let f = fixture();
    let server = start_tcp(f.exports);
    let output = run(Command::new("qemu-io").args([
        "-f",
        "raw",
        &server.uri("slow"),
        "-c",
        &format!("read {FAILING_OFFSET} 4096"),
    ]));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("Input/output error"), "stdout: {stdout}");
}

#[test]
fn nbdcopy_round_trips_a_sparse_image_over_several_connections() {
    if !have_tool("nbdcopy") {
        return;
    }
    let scratch = ScratchDir::new("nbdcopy");
    let source = scratch.0.join("source.img");
    let copy = scratch.0.join("copy.img");
    let mut image = vec![0u8; DISK_BYTES as usize];
    for (index, byte) in image.iter_mut().enumerate() {
        // Data in the first and third quarter, zeroes elsewhere, so both data and zero paths run.
        let quarter = index / (DISK_BYTES as usize / 4);
        if quarter.is_multiple_of(2) {
            *byte = (index % 253) as u8 | 1;
        }
    }
    std::fs::write(&source, &image).expect("write source image");

    let f = fixture();
    let server = start_tcp(f.exports.clone());
    let uri = server.uri("disk0");
    run_ok(Command::new("nbdcopy").args(["--flush", source.to_str().expect("utf-8 path"), &uri]));
    assert_eq!(f.disk.contents(0, image.len()), image);
    assert!(f.disk.flushes.load(Ordering::SeqCst) >= 1);
    run_ok(Command::new("nbdcopy").args([&uri, copy.to_str().expect("utf-8 path")]));
    let copied = std::fs::read(&copy).expect("read copy");
    assert!(
        copied == image,
        "image changed on the way through the server"
    );
}

#[test]
fn nbdsh_fast_zero_block_status_and_server_side_errors() {
    if !have_nbdsh() {
        return;
    }
    let f = fixture();
    f.disk.fill(0, &[7; 8192]);
    let server = start_tcp(f.exports.clone());
    let script = format!(
        r#"
def expect_error(name, call):
    try:
        call()
    except nbd.Error as e:
        assert e.errno == name, (name, e.errno, e.string)
        return
    raise AssertionError("expected " + name)

# FAST_ZERO that would have to write for real fails fast with ENOTSUP and changes nothing.
expect_error("ENOTSUP", lambda: h.zero(4096, 0, nbd.CMD_FLAG_NO_HOLE | nbd.CMD_FLAG_FAST_ZERO))
assert h.pread(4096, 0) == b"\x07" * 4096
# Punching is fast.
h.zero(4096, 0, nbd.CMD_FLAG_FAST_ZERO)
assert h.pread(4096, 0) == bytes(4096)

entries = []
def extent(context, offset, descriptors, error):
    entries.append((context, offset, list(descriptors)))
h.block_status(65536, 0, extent)
assert entries[-1] == ("base:allocation", 0, [4096, 3, 4096, 0, 57344, 3]), entries
h.block_status(65536, 0, extent, nbd.CMD_FLAG_REQ_ONE)
assert entries[-1] == ("base:allocation", 0, [4096, 3]), entries

h.pwrite(b"\x01" * 512, {last_sector}, nbd.CMD_FLAG_FUA)
h.cache(4096, 0)
h.trim(4096, 4096)
h.flush()

# Send requests the client library would normally refuse, to see the server's own checks.
h.set_strict_mode(0)
expect_error("EINVAL", lambda: h.pread(4096, {size} - 100))
expect_error("ENOSPC", lambda: h.pwrite(b"x" * 4096, {size} - 100))
expect_error("EINVAL", lambda: h.trim(4096, {size}))
expect_error("EINVAL", lambda: h.block_status(4096, {size}, extent))

ro = nbd.NBD()
ro.set_strict_mode(0)
ro.connect_uri("{ro_uri}")
expect_error("EPERM", lambda: ro.pwrite(b"x", 0))
expect_error("EPERM", lambda: ro.trim(512, 0))
expect_error("EPERM", lambda: ro.zero(512, 0))
assert ro.pread(251, 0) == bytes(range(251))

slow = nbd.NBD()
slow.connect_uri("{slow_uri}")
expect_error("EIO", lambda: slow.pread(4096, {failing}))
assert slow.pread(4096, 8192) == bytes(4096)
"#,
        last_sector = DISK_BYTES - 512,
        size = DISK_BYTES,
        ro_uri = server.uri("ro"),
        slow_uri = server.uri("slow"),
        failing = FAILING_OFFSET,
    );
    run_ok(nbdsh().args([
        "--base-allocation",
        "-u",
        &server.uri("disk0"),
        "-c",
        &script,
    ]));
    assert_eq!(f.disk.contents(DISK_BYTES - 512, 512), vec![1; 512]);
    assert!(
        !f.disk.is_allocated(4096),
        "trim should have punched the block"
    );
    assert!(f.disk.fua_writes.load(Ordering::SeqCst) >= 1);
}

#[test]
fn nbdinfo_over_a_unix_socket() {
    if !have_tool("nbdinfo") {
        return;
    }
    let scratch = ScratchDir::new("unix");
    let socket = scratch.0.join("nbd.sock");
    let f = fixture();
    let _server = crate::common::start_unix(f.exports, &socket);
    let uri = format!("nbd+unix:///ro?socket={}", socket.display());
    let info = json(&run_ok(Command::new("nbdinfo").args(["--json", &uri])));
    assert_eq!(info["exports"][0]["export-size"], SMALL_BYTES);
    assert_eq!(info["exports"][0]["is_read_only"], true);
}
