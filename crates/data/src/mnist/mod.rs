//! MNIST: the IDX reader, loading from a directory, and the 10,000-digit subset embedded in
//! this crate (7,996 training and 2,004 test images).
//!
//! ```
//! use lockstep_data::Dataset;
//! use lockstep_data::mnist::{Mnist, scale};
//!
//! let mnist = Mnist::embedded()?;
//! assert_eq!(mnist.train.images.shape(), [7996, 28, 28, 1]);
//! let pipeline = mnist.train.dataset()?.map(|(image, label)| (scale(&image), label)).batch(64, false);
//! let (x, y) = pipeline.iter()?.next().unwrap()?;
//! assert_eq!((x.shape(), y.len()), ([64, 28, 28, 1].as_slice(), 64));
//! # Ok::<(), lockstep_data::DataError>(())
//! ```

mod idx;

use std::path::{Path, PathBuf};

use ndarray::{Array1, Array3, Array4};

pub use idx::{IdxArray, read_idx};

use crate::error::DataError;
use crate::source::{FromSlices, from_slices};

/// Where Debian's package `dataset-fashion-mnist` installs Fashion-MNIST (Zalando's 60,000
/// training and 10,000 test images of clothing in MNIST's format, MIT licence).
pub const FASHION_MNIST_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// The standard file names, without the optional `.gz`.
pub const TRAIN_IMAGES: &str = "train-images-idx3-ubyte";
/// See [`TRAIN_IMAGES`].
pub const TRAIN_LABELS: &str = "train-labels-idx1-ubyte";
/// See [`TRAIN_IMAGES`].
pub const TEST_IMAGES: &str = "t10k-images-idx3-ubyte";
/// See [`TRAIN_IMAGES`].
pub const TEST_LABELS: &str = "t10k-labels-idx1-ubyte";

/// The embedded subset, in the order train images, train labels, test images, test labels.
#[cfg(feature = "embedded-mnist")]
const EMBEDDED: [(&str, &[u8]); 4] = [
    (
        TRAIN_IMAGES,
        include_bytes!("../../data/mnist/train-images-idx3-ubyte.gz"),
    ),
    (
        TRAIN_LABELS,
        include_bytes!("../../data/mnist/train-labels-idx1-ubyte.gz"),
    ),
    (
        TEST_IMAGES,
        include_bytes!("../../data/mnist/t10k-images-idx3-ubyte.gz"),
    ),
    (
        TEST_LABELS,
        include_bytes!("../../data/mnist/t10k-labels-idx1-ubyte.gz"),
    ),
];

/// The dataset of [`MnistSplit::dataset`]: `(image, label)` pairs.
pub type MnistDataset = FromSlices<(Array4<u8>, Vec<u8>)>;

/// One split of MNIST: images `[N, height, width, 1]` (NHWC, as Keras) and labels 0–9.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MnistSplit {
    /// Pixel values 0–255.
    pub images: Array4<u8>,
    /// Digits 0–9.
    pub labels: Array1<u8>,
}

impl MnistSplit {
    /// The number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// `true` when the split holds no examples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// All images scaled to `f32` in `[0, 1]`.
    pub fn images_f32(&self) -> Array4<f32> {
        self.images.mapv(|p| f32::from(p) / 255.0)
    }

    /// A dataset of `(image [28, 28, 1] as u8, label)` pairs; follow it with
    /// `.map(|(x, y)| (scale(&x), y))` as the Keras tutorials do (`scale(&x).into_shared()`
    /// before a `cache()`, so replays share pixels instead of copying them).
    ///
    /// # Errors
    ///
    /// Never for a split built by this module (images and labels agree in number).
    pub fn dataset(&self) -> Result<MnistDataset, DataError> {
        from_slices((self.images.clone(), self.labels.to_vec()))
    }
}

/// Scales one image's pixels to `f32` in `[0, 1]`.
pub fn scale(image: &Array3<u8>) -> Array3<f32> {
    image.mapv(|p| f32::from(p) / 255.0)
}

/// The training and test splits of MNIST.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mnist {
    /// The training split.
    pub train: MnistSplit,
    /// The test split.
    pub test: MnistSplit,
}

impl Mnist {
    /// The 10,000-digit subset shipped inside this crate (CC BY-SA 3.0; authors and source in
    /// the crate's `data/mnist/README.md`), with the `embedded-mnist` feature (a default).
    ///
    /// # Errors
    ///
    /// Only if the embedded files were damaged at build time.
    #[cfg(feature = "embedded-mnist")]
    pub fn embedded() -> Result<Self, DataError> {
        let [train_images, train_labels, test_images, test_labels] =
            EMBEDDED.map(|(name, bytes)| {
                read_idx(bytes, &Path::new("<embedded>").join(format!("{name}.gz")))
            });
        Ok(Self {
            train: split(train_images?, train_labels?, TRAIN_IMAGES, TRAIN_LABELS)?,
            test: split(test_images?, test_labels?, TEST_IMAGES, TEST_LABELS)?,
        })
    }

    /// Loads MNIST from a directory holding the four standard files, each raw or with
    /// `.gz` — the 10,000-digit subset, the full 70,000, or anything in the same format.
    ///
    /// # Errors
    ///
    /// [`DataError::Io`] for a missing or unreadable file, [`DataError::BadFile`] for a
    /// malformed one or for images and labels that disagree.
    pub fn load(dir: &Path) -> Result<Self, DataError> {
        let file = |name: &str| {
            let (path, bytes) = read_either(dir, name)?;
            read_idx(&bytes, &path)
        };
        Ok(Self {
            train: split(
                file(TRAIN_IMAGES)?,
                file(TRAIN_LABELS)?,
                TRAIN_IMAGES,
                TRAIN_LABELS,
            )?,
            test: split(
                file(TEST_IMAGES)?,
                file(TEST_LABELS)?,
                TEST_IMAGES,
                TEST_LABELS,
            )?,
        })
    }

    /// Fashion-MNIST from [`FASHION_MNIST_DIR`] (a drop-in replacement of MNIST: the same
    /// format, shapes and ten classes).
    ///
    /// # Errors
    ///
    /// As [`Mnist::load`]; a missing directory's error says which package installs it.
    pub fn fashion() -> Result<Self, DataError> {
        let dir = Path::new(FASHION_MNIST_DIR);
        if !dir.is_dir() {
            return Err(DataError::Io {
                path: dir.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "Fashion-MNIST is not installed (Debian: apt-get install dataset-fashion-mnist)",
                ),
            });
        }
        Self::load(dir)
    }

    /// [`Mnist::load`] from `dir` when given, else [`Mnist::embedded`].
    ///
    /// # Errors
    ///
    /// As for those two.
    #[cfg(feature = "embedded-mnist")]
    pub fn load_or_embedded(dir: Option<&Path>) -> Result<Self, DataError> {
        dir.map_or_else(Self::embedded, Self::load)
    }
}

/// Reads `name.gz` or, failing that, `name` from `dir`.
fn read_either(dir: &Path, name: &str) -> Result<(PathBuf, Vec<u8>), DataError> {
    let gz = dir.join(format!("{name}.gz"));
    match std::fs::read(&gz) {
        Ok(bytes) => Ok((gz, bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let raw = dir.join(name);
            std::fs::read(&raw)
                .map(|bytes| (raw.clone(), bytes))
                .map_err(|source| {
                    if source.kind() == std::io::ErrorKind::NotFound {
                        DataError::io(
                            &raw,
                            std::io::Error::new(
                                source.kind(),
                                format!("neither {name} nor {name}.gz is in {}", dir.display()),
                            ),
                        )
                    } else {
                        DataError::io(&raw, source)
                    }
                })
        }
        Err(e) => Err(DataError::io(gz, e)),
    }
}

fn split(
    images: IdxArray,
    labels: IdxArray,
    images_name: &str,
    labels_name: &str,
) -> Result<MnistSplit, DataError> {
    let [count, height, width] = images.dims[..] else {
        return Err(DataError::bad_file(
            images_name,
            format!(
                "images must have 3 dimensions (count, rows, columns), not {:?}",
                images.dims
            ),
        ));
    };
    let [label_count] = labels.dims[..] else {
        return Err(DataError::bad_file(
            labels_name,
            format!("labels must have 1 dimension, not {:?}", labels.dims),
        ));
    };
    if label_count != count {
        return Err(DataError::bad_file(
            labels_name,
            format!("{label_count} labels for the {count} images of {images_name}"),
        ));
    }
    if let Some(index) = labels.data.iter().position(|&l| l > 9) {
        return Err(DataError::bad_file(
            labels_name,
            format!(
                "label {} at index {index} is not a digit 0–9",
                labels.data[index]
            ),
        ));
    }
    let images = Array4::from_shape_vec((count, height, width, 1), images.data)
        .map_err(|e| DataError::bad_file(images_name, e.to_string()))?;
    Ok(MnistSplit {
        images,
        labels: Array1::from(labels.data),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(dims: &[u32], data: &[u8]) -> IdxArray {
        IdxArray {
            dims: dims.iter().map(|&d| d as usize).collect(),
            data: data.to_vec(),
        }
    }

    #[test]
    fn the_embedded_subset_has_the_documented_sizes() {
        let mnist = Mnist::embedded().unwrap();
        assert_eq!(mnist.train.images.shape(), [7996, 28, 28, 1]);
        assert_eq!(mnist.test.images.shape(), [2004, 28, 28, 1]);
        assert!(mnist.train.labels.iter().all(|&l| l <= 9));
        let scaled = mnist.test.images_f32();
        assert!(scaled.iter().all(|&p| (0.0..=1.0).contains(&p)));
        assert!(scaled.iter().any(|&p| p == 1.0));
    }

    #[test]
    fn disagreeing_images_and_labels_are_refused() {
        let err = split(
            idx(&[2, 1, 1], &[0, 0]),
            idx(&[3], &[1, 2, 3]),
            "imgs",
            "lbls",
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "lbls: 3 labels for the 2 images of imgs");
        let err = split(idx(&[1, 1, 1], &[0]), idx(&[1], &[12]), "imgs", "lbls").unwrap_err();
        assert!(err.to_string().contains("label 12 at index 0"), "{err}");
        let err = split(idx(&[2, 1], &[0, 0]), idx(&[2], &[1, 2]), "imgs", "lbls").unwrap_err();
        assert!(err.to_string().contains("3 dimensions"), "{err}");
    }
}
