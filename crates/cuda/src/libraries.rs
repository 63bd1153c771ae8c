//! Finding NVIDIA's libraries where CUDA installs them or where pip's `nvidia-*` wheels put
//! them.
//!
//! cudarc opens `libnvrtc.so.13` and `libcublas.so.13` by name, so only the loader's path is
//! searched, and that path is fixed when the process starts. The wheels of `PyTorch` put these
//! libraries in `site-packages/nvidia/*/lib` instead. So before cudarc looks, each library is
//! found here and opened by its full path with `RTLD_GLOBAL`; the loader then answers cudarc's
//! lookup by name with the library already loaded (the names are the libraries' sonames).
//!
//! Where each library is taken from, in order:
//! 1. the folders `LOCKSTEP_CUDA_LIBRARY_PATH` names (separated by `:`): what the user names
//!    wins over a system CUDA of another version, or a stub, on the loader's path;
//! 2. the loader's own path (`LD_LIBRARY_PATH`, the system's folders);
//! 3. `nvidia/*/lib` under the `site-packages` folders of the active virtual environment
//!    (`VIRTUAL_ENV`), of every `python3` on `PATH` (a virtual environment's `bin/python3` is
//!    found there even when it is not activated, as on machines whose PyTorch lives in
//!    `/opt/…/.venv`), of the user (`~/.local`) and of the system Pythons (`/usr/local/lib`,
//!    `/usr/lib`), then `/usr/local/cuda/lib64`.
//!
//! cudarc asks the loader for the unversioned name (`libnvrtc.so`) before the versioned one: a
//! library taken from a named folder is refused with [`CudaError::ShadowedLibrary`] when the
//! loader finds another file under that name, rather than used beside it.
//!
//! [`locations`] reports, for a GPU machine's log, the file each library comes from and the
//! version it reports of itself.

#![allow(
    unsafe_code,
    reason = "opening a shared library runs its initialisers, and asking its version calls it; \
              see the SAFETY comments"
)]

use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
#[cfg(feature = "cuda")]
use std::sync::{Mutex, PoisonError};

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

#[cfg(feature = "cuda")]
use crate::error::CudaError;

/// The variable naming the folders searched first, separated by `:`.
pub const LIBRARY_PATH_VAR: &str = "LOCKSTEP_CUDA_LIBRARY_PATH";

/// The driver's library, which the NVIDIA driver installs and the loader finds by name.
pub(crate) const DRIVER: &str = "libcuda.so.1";

/// NVRTC, the runtime compiler, and the built-in headers it opens itself.
pub(crate) const NVRTC: &[&str] = &["libnvrtc.so.13", "libnvrtc-builtins.so.13"];

/// cuBLAS and cuBLASLt, which cuBLAS calls.
pub(crate) const CUBLAS: &[&str] = &["libcublasLt.so.13", "libcublas.so.13"];

/// NCCL, the collectives between GPUs (pip's `nvidia-nccl-cu13` wheel ships it under this
/// name only).
pub(crate) const NCCL: &[&str] = &["libnccl.so.2"];

/// The libraries cudarc opens itself, trying the unversioned name first: a file the loader
/// finds under that name would be used instead of the one taken here.
#[cfg(feature = "cuda")]
const OPENED_BY_CUDARC: &[&str] = &["libnvrtc.so.13", "libcublas.so.13"];

/// Libraries opened here, kept open for the life of the process.
#[cfg(feature = "cuda")]
static OPENED: Mutex<Vec<(String, Library)>> = Mutex::new(Vec::new());

/// The folders `LOCKSTEP_CUDA_LIBRARY_PATH` names, in order; only those that exist.
fn named_folders() -> Vec<PathBuf> {
    std::env::var_os(LIBRARY_PATH_VAR)
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|folder| folder.is_dir())
        .collect()
}

/// Every folder searched beside the loader's path, in order (the named folders first); only
/// those that exist.
pub fn search_folders() -> Vec<PathBuf> {
    let mut folders = named_folders();
    folders.extend(installed_folders());
    folders
}

/// The folders where CUDA and pip's wheels install the libraries (step 3 of the module's
/// order); only those that exist.
fn installed_folders() -> Vec<PathBuf> {
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
    let mut folders = Vec::new();
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

/// Where one library is loaded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// This file, in a folder `LOCKSTEP_CUDA_LIBRARY_PATH` names.
    Named(PathBuf),
    /// Found by the loader by name (`LD_LIBRARY_PATH`, the system's folders): the file it
    /// opened, where the loader says.
    LoaderPath(Option<PathBuf>),
    /// This file, in one of the folders where CUDA and pip's wheels install it.
    Installed(PathBuf),
    /// This file, in a folder `LOCKSTEP_CUDA_LIBRARY_PATH` names, which the loader refused
    /// for the reason given.
    Refused(PathBuf, String),
    /// Found nowhere.
    Missing,
}

impl Location {
    /// The file, where known.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Self::Named(path) | Self::Installed(path) | Self::Refused(path, _) => Some(path),
            Self::LoaderPath(path) => path.as_deref(),
            Self::Missing => None,
        }
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Named(path) => write!(f, "{} (named by {LIBRARY_PATH_VAR})", path.display()),
            Self::LoaderPath(Some(path)) => write!(f, "{} (on the loader's path)", path.display()),
            Self::LoaderPath(None) => f.write_str("on the loader's path"),
            Self::Installed(path) => write!(f, "{}", path.display()),
            Self::Refused(path, reason) => write!(
                f,
                "{} (named by {LIBRARY_PATH_VAR}) cannot be opened: {reason}",
                path.display()
            ),
            Self::Missing => f.write_str("not found"),
        }
    }
}

/// Where [`open`] found a library, and whether it could open it.
enum Opened {
    /// Opened: the handle, and where it came from.
    Loaded(Library, Location),
    /// Found in a folder `LOCKSTEP_CUDA_LIBRARY_PATH` names, but the loader refused the file
    /// (its reason): the user's choice is not passed over for another file.
    Refused(PathBuf, String),
    /// Found nowhere.
    Missing,
}

/// Opens `library` from the first place of the module's order that has it: `named` folders,
/// the loader's path, `installed` folders.
fn open(library: &str, named: &[PathBuf], installed: impl FnOnce() -> Vec<PathBuf>) -> Opened {
    if let Some(path) = find(library, named) {
        // SAFETY: the libraries named here are NVIDIA's CUDA libraries, which cudarc opens
        // anyway; their initialisers make no assumption about this process.
        return match unsafe { Library::open(Some(&path), RTLD_NOW | RTLD_GLOBAL) } {
            Ok(handle) => Opened::Loaded(handle, Location::Named(path)),
            Err(e) => Opened::Refused(path, e.to_string()),
        };
    }
    // SAFETY: as above; the loader finds the file by the library's name.
    if let Ok(handle) = unsafe { Library::open(Some(library), RTLD_NOW | RTLD_GLOBAL) } {
        let path = loaded_file(&handle);
        return Opened::Loaded(handle, Location::LoaderPath(path));
    }
    let Some(path) = find(library, &installed()) else {
        return Opened::Missing;
    };
    // SAFETY: as above; the file is the same library, found outside the loader's path.
    match unsafe { Library::open(Some(&path), RTLD_NOW | RTLD_GLOBAL) } {
        Ok(handle) => Opened::Loaded(handle, Location::Installed(path)),
        Err(_) => Opened::Missing,
    }
}

/// The start of glibc's `struct link_map` (`<link.h>`), whose first two members every glibc
/// has kept since the structure was made public.
#[repr(C)]
struct LinkMapHead {
    address: usize,
    name: *const c_char,
}

/// The file a loaded library was read from, as the loader records it.
fn loaded_file(handle: &Library) -> Option<PathBuf> {
    // `Library` has no accessor for its raw handle but `into_raw`, which consumes it: a bitwise
    // copy is consumed instead, never dropped, so the handle stays open and is closed once.
    // SAFETY: `ptr::read` of a value that `handle` keeps alive; the copy only gives its handle.
    let copy: Library = unsafe { std::ptr::read(handle) };
    let raw = copy.into_raw();
    let mut map: *const LinkMapHead = std::ptr::null();
    // SAFETY: `raw` is a live handle from `dlopen`; RTLD_DI_LINKMAP writes one pointer.
    let found =
        unsafe { libc::dlinfo(raw, libc::RTLD_DI_LINKMAP, (&raw mut map).cast::<c_void>()) };
    if found != 0 || map.is_null() {
        return None;
    }
    // SAFETY: the loader's link map of a loaded library, whose name is a C string it owns for
    // as long as the library stays loaded (it does: `handle` holds it).
    let name = unsafe { (*map).name };
    if name.is_null() {
        return None;
    }
    // SAFETY: as above.
    let name = unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned();
    (!name.is_empty()).then(|| PathBuf::from(name))
}

/// The name cudarc asks the loader for before `library`'s versioned soname: `libnvrtc.so` for
/// `libnvrtc.so.13`.
#[cfg(any(feature = "cuda", test))]
fn unversioned(library: &str) -> Option<&str> {
    library
        .find(".so.")
        .map(|end| &library[..end + ".so".len()])
}

/// Refuses `path`, taken for `library` from a named folder, when the loader finds another file
/// under the unversioned name cudarc asks for first (which it would load instead).
#[cfg(feature = "cuda")]
fn check_not_shadowed(library: &'static str, path: &Path) -> Result<(), CudaError> {
    let Some(name) = unversioned(library).filter(|_| OPENED_BY_CUDARC.contains(&library)) else {
        return Ok(());
    };
    // SAFETY: as in `open`: what the loader finds under this name is the library cudarc
    // would open anyway (a second copy of it, of another version, whose initialisers run
    // beside the first's as they would when cudarc opened it; it is refused, not used).
    let Ok(other) = (unsafe { Library::open(Some(name), RTLD_NOW) }) else {
        return Ok(());
    };
    let Some(other) = loaded_file(&other) else {
        return Ok(());
    };
    let same = |a: &Path, b: &Path| match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    };
    if same(&other, path) {
        return Ok(());
    }
    Err(CudaError::ShadowedLibrary {
        library,
        named: path.to_path_buf(),
        unversioned: name.to_owned(),
        other,
    })
}

/// Makes each of `libraries` loadable by name, opened from the first place of the module's
/// order that has it.
///
/// # Errors
///
/// [`CudaError::MissingLibrary`] naming the first library found nowhere;
/// [`CudaError::ShadowedLibrary`] when one taken from a named folder would be passed over.
#[cfg(feature = "cuda")]
pub(crate) fn ensure(libraries: &[&'static str]) -> Result<(), CudaError> {
    let mut opened = OPENED.lock().unwrap_or_else(PoisonError::into_inner);
    let named = named_folders();
    for &library in libraries {
        if opened.iter().any(|(name, _)| name == library) {
            continue;
        }
        let (handle, location) = match open(library, &named, installed_folders) {
            Opened::Loaded(handle, location) => (handle, location),
            Opened::Refused(path, reason) => {
                return Err(CudaError::UnopenableLibrary {
                    library,
                    path,
                    reason,
                });
            }
            Opened::Missing => {
                return Err(CudaError::MissingLibrary {
                    library,
                    searched: search_folders(),
                });
            }
        };
        if let Location::Named(path) = &location {
            check_not_shadowed(library, path)?;
        }
        tracing::debug!(library, location = %location, "opened a CUDA library");
        opened.push((library.to_owned(), handle));
    }
    Ok(())
}

/// One library: where it is loaded from, and the version it reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibraryReport {
    /// The library's file name, as the loader looks it up.
    pub library: &'static str,
    /// Where it comes from.
    pub location: Location,
    /// The version the library reports of itself (the driver's, NVRTC's, cuBLAS's, NCCL's
    /// own call), or the one its file's name carries; `None` where neither says.
    pub version: Option<String>,
}

impl std::fmt::Display for LibraryReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.library, self.location)?;
        if let Some(version) = &self.version {
            write!(f, ", version {version}")?;
        }
        Ok(())
    }
}

/// Each CUDA library this crate uses, the driver's first, with the file it is loaded from and
/// its version: what a GPU machine's log prints before its tests. Opens each library as
/// [`ensure`] would, and nothing else.
pub fn locations() -> Vec<LibraryReport> {
    let named = named_folders();
    let mut reports = Vec::new();
    let libraries = std::iter::once(DRIVER)
        .chain(NVRTC.iter().copied())
        .chain(CUBLAS.iter().copied())
        .chain(NCCL.iter().copied());
    for library in libraries {
        let found = if library == DRIVER {
            open_driver()
        } else {
            open(library, &named, installed_folders)
        };
        let report = match found {
            Opened::Loaded(handle, location) => LibraryReport {
                library,
                version: reported_version(library, &handle)
                    .or_else(|| location.path().and_then(file_version)),
                location,
            },
            Opened::Refused(path, reason) => LibraryReport {
                library,
                location: Location::Refused(path, reason),
                version: None,
            },
            Opened::Missing => LibraryReport {
                library,
                location: Location::Missing,
                version: None,
            },
        };
        reports.push(report);
    }
    reports
}

/// The driver's library as cudarc opens it: by name from the loader alone, `libcuda.so`
/// (a toolkit's stub, where one is on the loader's path) before `libcuda.so.1`.
fn open_driver() -> Opened {
    for name in ["libcuda.so", DRIVER] {
        // SAFETY: the NVIDIA driver's library, which cudarc opens by these names anyway.
        if let Ok(handle) = unsafe { Library::open(Some(name), RTLD_NOW | RTLD_GLOBAL) } {
            let path = loaded_file(&handle);
            return Opened::Loaded(handle, Location::LoaderPath(path));
        }
    }
    Opened::Missing
}

/// The version `library` reports through its own call, where it has one.
fn reported_version(library: &str, handle: &Library) -> Option<String> {
    /// `int f(int*)`: the driver's and NCCL's version calls.
    type OneInt = unsafe extern "C" fn(*mut c_int) -> c_int;
    /// `int f(int, int*)`: cuBLAS's property call.
    type Property = unsafe extern "C" fn(c_int, *mut c_int) -> c_int;
    /// `int f(int*, int*)`: NVRTC's version call.
    type TwoInts = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
    /// `size_t f(void)`: cuBLASLt's version call.
    type Size = unsafe extern "C" fn() -> usize;
    let code = |symbol: &[u8]| -> Option<c_int> {
        // SAFETY: each symbol named below is the library's own version call, of this C type
        // (cuda.h, nccl.h); it writes one int.
        let call = unsafe { handle.get::<OneInt>(symbol) }.ok()?;
        let mut value: c_int = 0;
        // SAFETY: as above.
        (unsafe { call(&raw mut value) } == 0).then_some(value)
    };
    match library {
        DRIVER => {
            code(b"cuDriverGetVersion\0").map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))
        }
        // NCCL 2.9 and later: major·10000 + minor·100 + patch; before: major·1000 + minor·100
        // + patch.
        "libnccl.so.2" => code(b"ncclGetVersion\0").map(|v| {
            let (major, rest) = if v >= 10_000 {
                (v / 10_000, v % 10_000)
            } else {
                (v / 1000, v % 1000)
            };
            format!("{major}.{}.{}", rest / 100, rest % 100)
        }),
        "libnvrtc.so.13" => {
            // SAFETY: `nvrtcVersion(int*, int*)` (nvrtc.h) writes two ints.
            let call = unsafe { handle.get::<TwoInts>(b"nvrtcVersion\0") }.ok()?;
            let (mut major, mut minor): (c_int, c_int) = (0, 0);
            // SAFETY: as above.
            (unsafe { call(&raw mut major, &raw mut minor) } == 0)
                .then(|| format!("{major}.{minor}"))
        }
        "libcublas.so.13" => {
            // SAFETY: `cublasGetProperty(libraryPropertyType, int*)` (cublas_api.h) writes one
            // int; 0, 1, 2 ask for the major version, the minor and the patch level.
            let call = unsafe { handle.get::<Property>(b"cublasGetProperty\0") }.ok()?;
            let part = |kind: c_int| {
                let mut value: c_int = 0;
                // SAFETY: as above.
                (unsafe { call(kind, &raw mut value) } == 0).then_some(value)
            };
            Some(format!("{}.{}.{}", part(0)?, part(1)?, part(2)?))
        }
        "libcublasLt.so.13" => {
            // SAFETY: `cublasLtGetVersion(void)` (cublasLt.h) returns the version as
            // major·10000 + minor·100 + patch.
            let call = unsafe { handle.get::<Size>(b"cublasLtGetVersion\0") }.ok()?;
            // SAFETY: as above.
            let v = unsafe { call() };
            Some(format!("{}.{}.{}", v / 10_000, (v % 10_000) / 100, v % 100))
        }
        _ => None,
    }
}

/// The version a library's file name carries past `.so.` (`13.0.88` of
/// `libnvrtc-builtins.so.13.0.88`), read through links to the file itself.
fn file_version(path: &Path) -> Option<String> {
    let file = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let name = file.file_name()?.to_str()?;
    let (_, version) = name.split_once(".so.")?;
    (!version.is_empty() && version.starts_with(|c: char| c.is_ascii_digit()))
        .then(|| version.to_owned())
}

/// Whether the CUDA driver library can be loaded: cudarc panics when it is asked for the
/// driver and there is none, so this is checked first.
#[cfg(feature = "cuda")]
pub(crate) fn driver_present() -> bool {
    // SAFETY: loads `libcuda` (the NVIDIA driver's library) when present, as cudarc would.
    unsafe { cudarc::driver::sys::is_culib_present() }
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

    /// A library every glibc system has on the loader's path, by its soname: an empty stub
    /// since glibc 2.34, so that loading a second copy of it changes nothing.
    const ON_THE_LOADERS_PATH: &str = "libdl.so.2";

    /// Where `open` took `library` from (a test's library is always opened).
    fn opened_from(
        library: &str,
        named: &[PathBuf],
        installed: impl FnOnce() -> Vec<PathBuf>,
    ) -> (Library, Location) {
        match open(library, named, installed) {
            Opened::Loaded(handle, location) => (handle, location),
            Opened::Refused(path, reason) => panic!("{} refused: {reason}", path.display()),
            Opened::Missing => panic!("{library} found nowhere"),
        }
    }

    #[test]
    fn a_named_folder_wins_over_the_loaders_path_which_wins_over_the_installed_folders() {
        let (handle, location) = opened_from(ON_THE_LOADERS_PATH, &[], Vec::new);
        let Location::LoaderPath(Some(system)) = location else {
            panic!("{location:?}")
        };
        assert!(system.is_file(), "{}", system.display());
        assert_eq!(loaded_file(&handle).as_ref(), Some(&system));
        // A copy in a named folder is taken instead of the loader's, and one in an installed
        // folder is not.
        let temp = tempfile::tempdir().unwrap();
        let copy = temp.path().join(ON_THE_LOADERS_PATH);
        std::fs::copy(&system, &copy).unwrap();
        let folders = vec![temp.path().to_path_buf()];
        let (_, named) = opened_from(ON_THE_LOADERS_PATH, &folders, Vec::new);
        assert_eq!(named, Location::Named(copy.clone()));
        let (_, installed) = opened_from(ON_THE_LOADERS_PATH, &[], || folders.clone());
        assert!(
            matches!(installed, Location::LoaderPath(_)),
            "{installed:?}"
        );
        // Found only in an installed folder: taken from there.
        let only_there = "liblockstep-found-only-here.so.1";
        std::fs::copy(&system, temp.path().join(only_there)).unwrap();
        let (_, installed) = opened_from(only_there, &[], || folders.clone());
        assert_eq!(installed, Location::Installed(temp.path().join(only_there)));
        assert!(matches!(
            open("liblockstep-no-such-library.so.13", &folders, Vec::new),
            Opened::Missing
        ));
    }

    #[test]
    fn a_named_file_the_loader_refuses_is_reported_not_passed_over() {
        let temp = tempfile::tempdir().unwrap();
        std::fs::write(temp.path().join(ON_THE_LOADERS_PATH), b"not a library").unwrap();
        let folders = vec![temp.path().to_path_buf()];
        let Opened::Refused(path, reason) = open(ON_THE_LOADERS_PATH, &folders, Vec::new) else {
            panic!("a file that is no library was taken, or another file instead")
        };
        assert_eq!(path, temp.path().join(ON_THE_LOADERS_PATH));
        let shown = Location::Refused(path, reason).to_string();
        assert!(shown.contains("cannot be opened"), "{shown}");
        assert!(shown.contains(LIBRARY_PATH_VAR), "{shown}");
    }

    #[test]
    fn the_unversioned_name_cudarc_asks_for_first_is_the_soname_cut_after_so() {
        assert_eq!(unversioned("libnvrtc.so.13"), Some("libnvrtc.so"));
        assert_eq!(unversioned("libcublasLt.so.13"), Some("libcublasLt.so"));
        assert_eq!(unversioned("libnvrtc.so"), None);
    }

    #[test]
    fn a_versioned_file_name_gives_its_version_through_links() {
        let temp = tempfile::tempdir().unwrap();
        let file = temp.path().join("libnvrtc-builtins.so.13.0.88");
        std::fs::write(&file, b"").unwrap();
        let link = temp.path().join("libnvrtc-builtins.so.13");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(file_version(&link).as_deref(), Some("13.0.88"));
        assert_eq!(
            file_version(Path::new("/x/libnccl.so.2")).as_deref(),
            Some("2")
        );
        assert_eq!(file_version(Path::new("/x/libnccl.so")), None);
    }

    #[test]
    fn every_library_is_reported_with_where_it_is_or_that_it_is_missing() {
        let reports = locations();
        let names: Vec<&str> = reports.iter().map(|r| r.library).collect();
        assert_eq!(names[0], DRIVER);
        assert!(names.contains(&"libnvrtc.so.13") && names.contains(&"libcublas.so.13"));
        assert!(names.contains(&"libnccl.so.2"));
        for report in reports {
            let line = report.to_string();
            assert!(line.starts_with(report.library), "{line}");
            match &report.location {
                Location::Missing => {
                    assert!(line.ends_with("not found"), "{line}");
                    assert_eq!(report.version, None);
                }
                found => assert!(found.path().is_some(), "{line}: no file named"),
            }
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
