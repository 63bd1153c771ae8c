//! Finding NVIDIA's libraries where CUDA installs them or where pip's `nvidia-*` wheels put
//! them.
//!
//! cudarc opens `libnvrtc.so.13` and `libcublas.so.13` by name, so only the loader's path is
//! searched, and that path is fixed when the process starts. The wheels of `PyTorch` put these
//! libraries in `site-packages/nvidia/*/lib` instead. So before cudarc looks, each library is
//! found here and opened by its full path with `RTLD_GLOBAL`; the loader then answers cudarc's
//! lookup by name with the library already loaded (the names are the libraries' sonames).
//!
//! Folders searched, in order, after the loader's own path: those in
//! `LOCKSTEP_CUDA_LIBRARY_PATH` (separated by `:`), then `nvidia/*/lib` under the
//! `site-packages` folders of the active virtual environment (`VIRTUAL_ENV`), of every
//! `python3` on `PATH` (a virtual environment's `bin/python3` is found there even when it is
//! not activated, as on machines whose PyTorch lives in `/opt/…/.venv`), of the user
//! (`~/.local`) and of the system Pythons (`/usr/local/lib`, `/usr/lib`), then
//! `/usr/local/cuda/lib64`.

#![allow(
    unsafe_code,
    reason = "opening a shared library runs its initialisers; see the SAFETY comment"
)]

use std::path::{Path, PathBuf};
#[cfg(feature = "cuda")]
use std::sync::{Mutex, PoisonError};

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

#[cfg(feature = "cuda")]
use crate::error::CudaError;

/// The variable naming extra folders to search, separated by `:`.
pub const LIBRARY_PATH_VAR: &str = "LOCKSTEP_CUDA_LIBRARY_PATH";

/// NVRTC, the runtime compiler, and the built-in headers it opens itself.
pub(crate) const NVRTC: &[&str] = &["libnvrtc.so.13", "libnvrtc-builtins.so.13"];

/// cuBLAS and cuBLASLt, which cuBLAS calls.
pub(crate) const CUBLAS: &[&str] = &["libcublasLt.so.13", "libcublas.so.13"];

/// NCCL, the collectives between GPUs (pip's `nvidia-nccl-cu13` wheel ships it under this
/// name only).
pub(crate) const NCCL: &[&str] = &["libnccl.so.2"];

/// Libraries opened here, kept open for the life of the process.
#[cfg(feature = "cuda")]
static OPENED: Mutex<Vec<(String, Library)>> = Mutex::new(Vec::new());

/// The folders searched beside the loader's path, in order; only those that exist.
pub fn search_folders() -> Vec<PathBuf> {
    let mut folders: Vec<PathBuf> = std::env::var_os(LIBRARY_PATH_VAR)
        .map(|paths| std::env::split_paths(&paths).collect())
        .unwrap_or_default();
    let mut prefixes: Vec<PathBuf> = Vec::new();
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        prefixes.push(PathBuf::from(venv).join("lib"));
    }
    prefixes.extend(python_prefixes(std::env::var_os("PATH").as_deref()));
    if let Some(home) = std::env::var_os("HOME") {
        prefixes.push(PathBuf::from(home).join(".local/lib"));
    }
    prefixes.extend(["/usr/local/lib", "/usr/lib"].map(PathBuf::from));
    let mut seen = Vec::new();
    prefixes.retain(|prefix| {
        let new = !seen.contains(prefix);
        seen.push(prefix.clone());
        new
    });
    for prefix in prefixes {
        for python in sorted_entries(&prefix, |name| name.starts_with("python3")) {
            for packages in ["site-packages", "dist-packages"] {
                let nvidia = python.join(packages).join("nvidia");
                for package in sorted_entries(&nvidia, |_| true) {
                    folders.push(package.join("lib"));
                }
            }
        }
    }
    folders.push(PathBuf::from("/usr/local/cuda/lib64"));
    folders.retain(|folder| folder.is_dir());
    folders
}

/// The `lib` folders beside each `python3` on `path` (a `PATH` value): `bin/python3`'s
/// `../lib`, as the folder holds it (a virtual environment's `python3` is a link to the base
/// interpreter, whose own prefix comes second, from the link's target).
fn python_prefixes(path: Option<&std::ffi::OsStr>) -> Vec<PathBuf> {
    let Some(path) = path else {
        return Vec::new();
    };
    let mut prefixes = Vec::new();
    for folder in std::env::split_paths(path) {
        let python = folder.join("python3");
        if !python.is_file() {
            continue;
        }
        let mut lib_beside = |bin: &Path| {
            if let Some(lib) = bin.parent().map(|prefix| prefix.join("lib"))
                && !prefixes.contains(&lib)
            {
                prefixes.push(lib);
            }
        };
        lib_beside(&folder);
        if let Some(bin) = std::fs::canonicalize(&python)
            .ok()
            .and_then(|target| target.parent().map(Path::to_path_buf))
        {
            lib_beside(&bin);
        }
    }
    prefixes
}

/// The entries of `folder` whose names pass `keep`, sorted; none when it cannot be read.
fn sorted_entries(folder: &Path, keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_str().is_some_and(&keep))
        .map(|entry| entry.path())
        .collect();
    paths.sort();
    paths
}

/// The first file in `folders` whose name is `library` or `library` and a longer version
/// (`libnvrtc-builtins.so.13.0` for `libnvrtc-builtins.so.13`).
pub(crate) fn find(library: &str, folders: &[PathBuf]) -> Option<PathBuf> {
    folders.iter().find_map(|folder| {
        let exact = folder.join(library);
        if exact.is_file() {
            return Some(exact);
        }
        sorted_entries(folder, |name| {
            name.strip_prefix(library)
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|version| version.starts_with(|c: char| c.is_ascii_digit()))
        })
        .into_iter()
        .find(|path| path.is_file())
    })
}

/// Makes each of `libraries` loadable by name: already on the loader's path, or opened here
/// from the first search folder holding it.
///
/// # Errors
///
/// [`CudaError::MissingLibrary`] naming the first library found nowhere.
#[cfg(feature = "cuda")]
pub(crate) fn ensure(libraries: &[&'static str]) -> Result<(), CudaError> {
    let mut opened = OPENED.lock().unwrap_or_else(PoisonError::into_inner);
    let mut folders = None;
    for &library in libraries {
        if opened.iter().any(|(name, _)| name == library) {
            continue;
        }
        // SAFETY: the libraries named here are NVIDIA's CUDA libraries, which cudarc opens
        // anyway; their initialisers make no assumption about this process.
        if let Ok(handle) = unsafe { Library::open(Some(library), RTLD_NOW | RTLD_GLOBAL) } {
            opened.push((library.to_owned(), handle));
            continue;
        }
        let folders = folders.get_or_insert_with(search_folders);
        let missing = || CudaError::MissingLibrary {
            library,
            searched: folders.clone(),
        };
        let path = find(library, folders).ok_or_else(missing)?;
        // SAFETY: as above; the file is the same library, found outside the loader's path.
        let handle =
            unsafe { Library::open(Some(&path), RTLD_NOW | RTLD_GLOBAL) }.map_err(|_| missing())?;
        tracing::debug!(library, path = %path.display(), "opened a CUDA library by its path");
        opened.push((library.to_owned(), handle));
    }
    Ok(())
}

/// Where one library would be loaded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// The loader finds it by name (`LD_LIBRARY_PATH`, the system's folders).
    LoaderPath,
    /// Found in this folder of [`search_folders`].
    File(PathBuf),
    /// Found nowhere.
    Missing,
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::LoaderPath => f.write_str("on the loader's path"),
            Self::File(path) => write!(f, "{}", path.display()),
            Self::Missing => f.write_str("not found"),
        }
    }
}

/// Where each CUDA library this crate uses would be loaded from, the driver's first: what a
/// GPU machine's log prints before its tests. Opens nothing that [`ensure`] would not.
pub fn locations() -> Vec<(&'static str, Location)> {
    let folders = search_folders();
    let mut found = vec![(
        "libcuda.so.1",
        if driver_present() {
            Location::LoaderPath
        } else {
            Location::Missing
        },
    )];
    for &library in NVRTC.iter().chain(CUBLAS).chain(NCCL) {
        // SAFETY: as in `ensure`: NVIDIA's libraries, which cudarc opens anyway.
        let by_name = unsafe { Library::open(Some(library), RTLD_NOW | RTLD_GLOBAL) }.is_ok();
        let location = if by_name {
            Location::LoaderPath
        } else {
            find(library, &folders).map_or(Location::Missing, Location::File)
        };
        found.push((library, location));
    }
    found
}

/// Whether the CUDA driver library can be loaded: cudarc panics when it is asked for the
/// driver and there is none, so this is checked first.
#[cfg(feature = "cuda")]
pub(crate) fn driver_present() -> bool {
    // SAFETY: loads `libcuda` (the NVIDIA driver's library) when present, as cudarc would.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether the CUDA driver library can be loaded (a build without the `cuda` feature still
/// says where the libraries are).
#[cfg(not(feature = "cuda"))]
pub(crate) fn driver_present() -> bool {
    // SAFETY: loads `libcuda` (the NVIDIA driver's library) by its name on Linux, as cudarc
    // would; its initialisers make no assumption about this process.
    unsafe { Library::open(Some("libcuda.so.1"), RTLD_NOW) }.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_is_found_by_its_name_or_a_longer_version() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().to_path_buf();
        std::fs::write(dir.join("libnvrtc-builtins.so.13.0"), b"").unwrap();
        std::fs::write(dir.join("libnvrtc.so.13"), b"").unwrap();
        let folders = vec![dir.join("missing"), dir.clone()];
        assert_eq!(
            find("libnvrtc-builtins.so.13", &folders),
            Some(dir.join("libnvrtc-builtins.so.13.0"))
        );
        assert_eq!(
            find("libnvrtc.so.13", &folders),
            Some(dir.join("libnvrtc.so.13"))
        );
        assert_eq!(find("libcublas.so.13", &folders), None);
        assert_eq!(find("libnvrtc", &folders), None);
    }

    #[test]
    fn the_site_packages_beside_every_python3_on_the_path_are_searched() {
        let temp = tempfile::tempdir().unwrap();
        let venv = temp.path().join("opt/torch/.venv");
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        std::fs::write(venv.join("bin/python3"), b"").unwrap();
        let lib = venv.join("lib/python3.12/site-packages/nvidia/cu13/lib");
        std::fs::create_dir_all(&lib).unwrap();
        let no_python = temp.path().join("usr/bin");
        std::fs::create_dir_all(&no_python).unwrap();
        let path = std::env::join_paths([no_python, venv.join("bin")]).unwrap();
        let prefixes = python_prefixes(Some(&path));
        assert_eq!(prefixes.first(), Some(&venv.join("lib")), "{prefixes:?}");
        assert!(python_prefixes(None).is_empty());
    }

    #[test]
    fn every_library_has_a_location_that_says_where_or_that_it_is_missing() {
        let locations = locations();
        let names: Vec<&str> = locations.iter().map(|(name, _)| *name).collect();
        assert_eq!(names[0], "libcuda.so.1");
        assert!(names.contains(&"libnvrtc.so.13") && names.contains(&"libcublas.so.13"));
        assert!(names.contains(&"libnccl.so.2"));
        for (name, location) in locations {
            assert!(!location.to_string().is_empty(), "{name}");
        }
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn a_library_found_nowhere_is_a_clear_error() {
        let err = ensure(&["liblockstep-no-such-library.so.13"]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("liblockstep-no-such-library.so.13"), "{text}");
        assert!(text.contains(LIBRARY_PATH_VAR), "{text}");
    }
}
