//! `tollgate-trim-callbacks SRC_DIR DST_DIR`: for every filter of the workspace (a `cdylib`
//! package, per `cargo metadata`), writes `DST_DIR/<lib>.wasm`: `SRC_DIR/<lib>.wasm` with the
//! exports of the proxy-wasm HTTP stream callbacks missing from its crate's
//! `[package.metadata.tollgate] http-callbacks` pointed at constant stubs (see the library's
//! docs). A destination that
//! already holds the trimmed bytes is left alone (its mtime too); a filter not built (no source
//! module) is skipped with a note. Run from the workspace (it calls
//! `cargo metadata --no-deps`). Exit 1 with a message naming the package on any error.

use std::path::Path;
use std::process::{Command, ExitCode};

use tollgate_trim_callbacks::{filters_from_metadata, trim};

fn run(src: &Path, dst: &Path) -> Result<(), String> {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    for filter in filters_from_metadata(&out.stdout)? {
        let input = src.join(&filter.file);
        let output = dst.join(&filter.file);
        if !input.exists() {
            eprintln!(
                "tollgate-trim-callbacks: {} not built, skipped",
                input.display()
            );
            continue;
        }
        let module = std::fs::read(&input).map_err(|e| format!("{}: {e}", input.display()))?;
        let keep: Vec<&str> = filter.callbacks.iter().map(String::as_str).collect();
        let root: Vec<&str> = filter.root_callbacks.iter().map(String::as_str).collect();
        let trimmed =
            trim(&module, &keep, &root).map_err(|e| format!("{}: {e}", filter.package))?;
        if std::fs::read(&output).ok().as_deref() == Some(trimmed.as_slice()) {
            continue;
        }
        let tmp = dst.join(format!("{}.trimmed", filter.file));
        std::fs::write(&tmp, &trimmed).map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &output).map_err(|e| format!("{}: {e}", output.display()))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [src, dst] = args.as_slice() else {
        eprintln!("usage: tollgate-trim-callbacks SRC_DIR DST_DIR");
        return ExitCode::FAILURE;
    };
    match run(Path::new(src), Path::new(dst)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate-trim-callbacks: {e}");
            ExitCode::FAILURE
        }
    }
}
