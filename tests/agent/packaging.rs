//! The packaging files that are not run by other tests: the systemd unit
//! (checked by systemd itself) and the Firecracker example config.

use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    // The unit as installed, pointed at this build's binary.
    let unit = std::fs::read_to_string(format!("{ROOT}/packaging/systemd/sandbox-agent.service"))
        .expect("unit");
    let unit = unit.replace(
        "/usr/local/bin/sandbox-agent",
        crate::common::AGENT.as_str(),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("sandbox-agent.service");
    std::fs::write(&path, unit).expect("write");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (package systemd)");
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        !text.contains("sandbox-agent.service:"),
        "warnings about the unit: {text}"
    );
}

#[test]
fn the_firecracker_config_maps_the_agent_ports_to_its_vsock_socket() {
    let text = std::fs::read_to_string(format!("{ROOT}/packaging/firecracker/vm-config.json"))
        .expect("config");
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let uds = v["vsock"]["uds_path"].as_str().expect("vsock.uds_path");
    assert!(v["vsock"]["guest_cid"].as_u64().is_some_and(|c| c > 3));
    let readme =
        std::fs::read_to_string(format!("{ROOT}/packaging/firecracker/README.md")).expect("README");
    for port in [1024, 1025] {
        assert!(
            readme.contains(&format!("hvsock://{uds}:{port}")),
            "README names hvsock://{uds}:{port}"
        );
    }
}

mod benchmark_data {
    use std::path::Path;
    use std::process::Command;

    use crate::common::bench_data::{
        ATLAS_CSV, installer, make_stand_ins, run_installer, write_atlas_data,
    };
    use crate::common::mcp::memory_js;
    use crate::common::*;
    use sandbox_client::proto;
    use tonic::Code;

    /// Runs the installer expecting a refusal; returns what it said.
    fn refused(args: &[&str]) -> String {
        let out = Command::new("bash")
            .arg(installer())
            .args(args)
            .output()
            .expect("bash");
        assert_eq!(out.status.code(), Some(2), "{args:?} should be refused");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    fn s(p: &Path) -> String {
        p.display().to_string()
    }

    /// Only data whose every file is pinned, with its pinned sum, and
    /// nothing else, is installed; a refusal leaves the installed tree as
    /// it was.
    #[test]
    fn only_pinned_data_is_installed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (src, pins, prefix) = (
            dir.path().join("src"),
            dir.path().join("pins"),
            dir.path().join("prefix"),
        );
        write_atlas_data(&src);
        let (src_s, pins_s, prefix_s) = (s(&src), s(&pins), s(&prefix));
        let no_pins = refused(&[
            "MCP_Atlas",
            "--from",
            &src_s,
            "--pins",
            &pins_s,
            "--prefix",
            &prefix_s,
        ]);
        assert!(no_pins.contains("--pin --from"), "{no_pins}");
        run_installer(&["MCP_Atlas", "--pin", "--from", &src_s, "--pins", &pins_s]);
        let install = [
            "MCP_Atlas",
            "--from",
            &src_s,
            "--pins",
            &pins_s,
            "--prefix",
            &prefix_s,
        ];
        run_installer(&install);
        let csv = prefix.join("MCP_Atlas").join(ATLAS_CSV);
        let good = std::fs::read_to_string(&csv).expect("installed");

        std::fs::write(src.join(ATLAS_CSV), "tampered\n").expect("write");
        let e = refused(&install);
        assert!(e.contains(ATLAS_CSV) && e.contains("FAILED"), "{e}");
        assert_eq!(std::fs::read_to_string(&csv).expect("kept"), good);
        std::fs::write(src.join(ATLAS_CSV), &good).expect("write");

        std::fs::write(src.join("unpinned.txt"), "x").expect("write");
        let e = refused(&install);
        assert!(e.contains("unpinned.txt"), "{e}");
        std::fs::remove_file(src.join("unpinned.txt")).expect("rm");

        std::os::unix::fs::symlink("/etc/passwd", src.join("link")).expect("symlink");
        let e = refused(&install);
        assert!(e.contains("./link"), "{e}");
        std::fs::remove_file(src.join("link")).expect("rm");

        std::fs::remove_file(src.join(ATLAS_CSV)).expect("rm");
        let e = refused(&install);
        assert!(e.contains(ATLAS_CSV), "{e}");
        std::fs::write(src.join(ATLAS_CSV), &good).expect("write");

        // From a URL: a tar.gz served on loopback.
        let served = dir.path().join("served");
        std::fs::create_dir_all(&served).expect("dir");
        let st = Command::new("tar")
            .args(["-czf", &s(&served.join("atlas.tar.gz")), "-C", &src_s, "."])
            .status()
            .expect("tar");
        assert!(st.success());
        std::fs::remove_dir_all(prefix.join("MCP_Atlas")).expect("rm");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port")
            .port();
        let mut http = Command::new("python3")
            .args([
                "-m",
                "http.server",
                "--bind",
                "127.0.0.1",
                &port.to_string(),
            ])
            .current_dir(&served)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python3 -m http.server");
        let url = format!("http://127.0.0.1:{port}/atlas.tar.gz");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let r = Command::new("bash")
            .arg(installer())
            .args([
                "MCP_Atlas",
                "--from",
                &url,
                "--pins",
                &pins_s,
                "--prefix",
                &prefix_s,
            ])
            .output()
            .expect("bash");
        let _ = http.kill();
        let _ = http.wait();
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        assert_eq!(std::fs::read_to_string(&csv).expect("from the URL"), good);
    }

    /// The repositories of `repos/git_submodule_info.csv` are cloned with
    /// their history, detached at the pin, their origin the listed URL
    /// (here from a local mirror); a pin the repository lacks, or a path
    /// outside /data/repos, installs nothing.
    #[test]
    fn repositories_are_cloned_at_their_pins() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (src, pins, prefix, mirror) = (
            dir.path().join("src"),
            dir.path().join("pins"),
            dir.path().join("prefix"),
            dir.path().join("mirror"),
        );
        write_atlas_data(&src);
        let list = dir.path().join("upstream.csv");
        std::fs::write(
            &list,
            "https://github.com/o/one.git,0000000000000000000000000000000000000000,/data/repos/one\n\
             https://github.com/o/two.git,0000000000000000000000000000000000000000,/data/repos/two",
        )
        .expect("list");
        // The data's own list, pinned with it.
        let csv = src.join("repos/git_submodule_info.csv");
        let stand_ins = make_stand_ins(&list, &mirror, &csv);
        let (src_s, pins_s, prefix_s) = (s(&src), s(&pins), s(&prefix));
        run_installer(&["MCP_Atlas", "--pin", "--from", &src_s, "--pins", &pins_s]);
        let base = format!("file://{}", mirror.display());
        let install = [
            "MCP_Atlas",
            "--from",
            &src_s,
            "--pins",
            &pins_s,
            "--prefix",
            &prefix_s,
            "--git-mirror",
            &base,
        ];
        let said = run_installer(&install);
        assert!(said.contains("3 files and 2 repositories"), "{said}");
        let git = |repo: &Path, args: &[&str]| {
            let out = Command::new("git")
                .arg("-C")
                .arg(repo)
                .args(args)
                .output()
                .expect("git");
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        for r in &stand_ins {
            let repo = prefix.join("MCP_Atlas").join(r.rel());
            assert_eq!(git(&repo, &["rev-parse", "HEAD"]), r.pin());
            assert_eq!(git(&repo, &["symbolic-ref", "-q", "HEAD"]), "", "detached");
            assert_eq!(git(&repo, &["config", "remote.origin.url"]), r.url);
            let all = git(&repo, &["log", "--all", "--format=%H"]);
            for c in &r.commits {
                assert!(all.contains(c.as_str()), "{c} in {all}");
            }
            assert_eq!(git(&repo, &["status", "--porcelain"]), "");
        }
        let csv_installed = prefix.join("MCP_Atlas/repos/git_submodule_info.csv");
        let good = std::fs::read(&csv_installed).expect("installed");

        // A pin the repository does not have.
        let other = dir.path().join("other.csv");
        std::fs::write(
            &other,
            format!(
                "{},{},/data/repos/one",
                stand_ins[0].url,
                stand_ins[1].pin()
            ),
        )
        .expect("list");
        let with_list = |l: &Path| {
            let mut a = install.map(str::to_owned).to_vec();
            a.extend(["--repos".to_owned(), s(l)]);
            a
        };
        let args = with_list(&other);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let e = refused(&args);
        assert!(e.contains(stand_ins[1].pin()), "{e}");
        // Outside /data/repos.
        std::fs::write(
            &other,
            format!("{},{},/data/../etc", stand_ins[0].url, stand_ins[0].pin()),
        )
        .expect("list");
        let args = with_list(&other);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let e = refused(&args);
        assert!(e.contains("not /data/repos/NAME"), "{e}");
        // Nothing was replaced.
        assert_eq!(std::fs::read(&csv_installed).expect("kept"), good);
    }

    /// The data's uv project is synced as MCP_Atlas's image does it: a
    /// `uv.lock`, and a `.venv` whose scripts name /data and whose package
    /// directories link to one read-only copy beside the data (here a
    /// one-dependency project, offline from the test wheels). A reinstall
    /// removes the copy it replaced; a sync that fails installs nothing
    /// and leaves nothing behind.
    #[test]
    fn the_uv_project_is_synced_as_the_image_does() {
        use crate::common::bench_data::{
            WORKSPACE_PROJECT, installer_env, write_workspace_project,
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let (src, pins, prefix) = (
            dir.path().join("src"),
            dir.path().join("pins"),
            dir.path().join("prefix"),
        );
        write_atlas_data(&src);
        write_workspace_project(&src, Some(&["python-dateutil==2.9.0.post0"]));
        let (src_s, pins_s, prefix_s) = (s(&src), s(&pins), s(&prefix));
        run_installer(&["MCP_Atlas", "--pin", "--from", &src_s, "--pins", &pins_s]);
        let install = [
            "MCP_Atlas",
            "--from",
            &src_s,
            "--pins",
            &pins_s,
            "--prefix",
            &prefix_s,
        ];
        let copies = || -> Vec<std::path::PathBuf> {
            let mut v: Vec<_> = std::fs::read_dir(&prefix)
                .expect("prefix")
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.to_string_lossy().contains("/.MCP_Atlas-venv."))
                .collect();
            v.sort();
            v
        };
        run_installer(&install);
        let project = prefix.join("MCP_Atlas").join(WORKSPACE_PROJECT);
        let venv = project.join(".venv");
        let lock = std::fs::read_to_string(project.join("uv.lock")).expect("uv.lock");
        assert!(lock.contains("name = \"python-dateutil\""), "{lock}");
        let activate = std::fs::read_to_string(venv.join("bin/activate")).expect("activate");
        assert!(
            activate.contains(&format!("/data/{WORKSPACE_PROJECT}/.venv")),
            "{activate}"
        );
        let site = std::fs::read_dir(venv.join("lib"))
            .expect("lib")
            .flatten()
            .next()
            .expect("lib/pythonX.Y")
            .path()
            .join("site-packages");
        let link = std::fs::read_link(site.join("dateutil")).expect("dateutil is a link");
        let first = copies();
        assert_eq!(first.len(), 1, "{first:?}");
        assert!(link.starts_with(&first[0]), "{link:?} into {first:?}");
        assert!(site.join("six.py").is_file(), "a module file is copied");
        let out = Command::new(venv.join("bin/python"))
            .args(["-c", "import dateutil, six; print(dateutil.__file__)"])
            .output()
            .expect("the data's venv python");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );

        run_installer(&install);
        let second = copies();
        assert!(
            second.len() == 1 && second != first,
            "{first:?} → {second:?}"
        );

        // A dependency the wheels do not have: uv fails offline.
        write_workspace_project(&src, Some(&["no-such-package-here==1.0"]));
        run_installer(&["MCP_Atlas", "--pin", "--from", &src_s, "--pins", &pins_s]);
        let out = Command::new("bash")
            .arg(installer())
            .args(install)
            .envs(installer_env())
            .output()
            .expect("bash");
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{said}");
        assert!(
            said.contains("uv sync of repos/mcp_code_executor_workspace failed"),
            "{said}"
        );
        assert_eq!(copies(), second, "the installed copy stays");
        assert!(std::fs::read_link(site.join("dateutil")).is_ok_and(|l| l.starts_with(&second[0])));
        let stages: Vec<_> = std::fs::read_dir(&prefix)
            .expect("prefix")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".MCP_Atlas."))
            .collect();
        assert!(stages.is_empty(), "a stage was left behind");
    }

    /// A profile with preloaded data: an Acquire of it fails, naming the
    /// installer, until the data is installed; then every Acquire and
    /// Reset places it in the workspace.
    #[tokio::test]
    async fn an_acquire_needs_its_profiles_data() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        let manifest = dir.path().join("servers.toml");
        std::fs::write(
            &manifest,
            format!(
                "[servers.notes]\ncommand = \"node\"\nargs = [\"{js}\"]\nenv = {{ MEMORY_FILE_PATH = \"{state}/notes.jsonl\" }}\n\n[benchmarks.MCP_Atlas]\ndata = \"{data}/MCP_Atlas\"\n",
                js = memory_js(),
                state = s(&dir.path().join("state")),
                data = s(&data)
            ),
        )
        .expect("manifest");
        let m = s(&manifest);
        let agent = Agent::start_in(dir, &["--manifest", &m], &[]);
        let c = sandbox_client::connect(&agent.unix_uri())
            .await
            .expect("connect");
        let atlas = |id: &str| proto::AcquireRequest {
            lease_id: id.into(),
            server_names: vec!["notes".into()],
            benchmark: proto::Benchmark::McpAtlas as i32,
            ttl_seconds: Some(0),
            ..Default::default()
        };
        let e = c.agent().acquire(atlas("a")).await.expect_err("no data");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
        assert!(
            e.message().contains("install-benchmark-data.sh MCP_Atlas"),
            "{e}"
        );

        let src = data.join("src");
        write_atlas_data(&src);
        let pins = s(&data.join("pins"));
        run_installer(&["MCP_Atlas", "--pin", "--from", &s(&src), "--pins", &pins]);
        run_installer(&[
            "MCP_Atlas",
            "--from",
            &s(&src),
            "--pins",
            &pins,
            "--prefix",
            &s(&data),
        ]);
        c.agent()
            .acquire(atlas("a"))
            .await
            .unwrap_or_else(|e| panic!("Acquire: {e}\n{}", agent.stderr.all()));
        let placed = agent.dir.path().join("ws").join(ATLAS_CSV);
        assert!(placed.exists(), "the data is in the workspace");
        std::fs::remove_file(&placed).expect("rm");
        c.agent()
            .reset(proto::ResetRequest {
                lease_id: "a".into(),
            })
            .await
            .expect("Reset");
        assert!(placed.exists(), "Reset places it again");
    }
}
