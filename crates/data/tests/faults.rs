//! Bad input is a clear error (or, for a cache, a rebuild), never a panic and never wrong data.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that meets an error must fail the test loudly"
)]

use std::fs;
use std::io::Write;
use std::path::Path;

use lockstep_data::mnist::{self, Mnist};
use lockstep_data::{
    AutoShardPolicy, DataError, Dataset, InputContext, IterState, distribute, from_files, from_vec,
};
use ndarray::{Array1, array};

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn idx(magic_rank: u8, dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0, 0, 8, magic_rank];
    for d in dims {
        bytes.extend_from_slice(&d.to_be_bytes());
    }
    bytes.extend_from_slice(data);
    bytes
}

/// Writes a tiny, valid MNIST directory (raw files, 3 train and 2 test images of 2×2).
fn tiny_mnist(dir: &Path) {
    let files = [
        (mnist::TRAIN_IMAGES, idx(3, &[3, 2, 2], &[0; 12])),
        (mnist::TRAIN_LABELS, idx(1, &[3], &[1, 2, 3])),
        (mnist::TEST_IMAGES, idx(3, &[2, 2, 2], &[255; 8])),
        (mnist::TEST_LABELS, idx(1, &[2], &[4, 5])),
    ];
    for (name, bytes) in files {
        fs::write(dir.join(name), bytes).unwrap();
    }
}

fn load_error(dir: &Path) -> String {
    Mnist::load(dir).unwrap_err().to_string()
}

#[test]
fn the_full_format_loads_from_raw_and_gzip_files_alike() {
    let dir = tempfile::tempdir().unwrap();
    let embedded = Mnist::embedded().unwrap();
    // The embedded subset written back out, uncompressed: the same reader must load it.
    let write = |name: &str, dims: &[u32], data: &[u8]| {
        fs::write(dir.path().join(name), idx(dims.len() as u8, dims, data)).unwrap();
    };
    for (split, images, labels) in [
        (&embedded.train, mnist::TRAIN_IMAGES, mnist::TRAIN_LABELS),
        (&embedded.test, mnist::TEST_IMAGES, mnist::TEST_LABELS),
    ] {
        write(
            images,
            &[split.len() as u32, 28, 28],
            split.images.as_slice().unwrap(),
        );
        write(
            labels,
            &[split.len() as u32],
            split.labels.as_slice().unwrap(),
        );
    }
    assert_eq!(Mnist::load(dir.path()).unwrap(), embedded);
    let from_shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist");
    assert_eq!(
        Mnist::load_or_embedded(Some(&from_shared)).unwrap(),
        embedded
    );
}

#[test]
fn a_missing_file_names_both_names_tried() {
    let dir = tempfile::tempdir().unwrap();
    let err = load_error(dir.path());
    assert!(
        err.contains("neither train-images-idx3-ubyte nor train-images-idx3-ubyte.gz"),
        "{err}"
    );
}

#[test]
fn a_truncated_gzip_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    tiny_mnist(dir.path());
    let gz = gzip(&idx(3, &[3, 2, 2], &[0; 12]));
    fs::write(
        dir.path().join("train-images-idx3-ubyte.gz"),
        &gz[..gz.len() - 6],
    )
    .unwrap();
    let err = load_error(dir.path());
    assert!(
        err.contains("train-images-idx3-ubyte.gz: corrupt or truncated gzip"),
        "{err}"
    );
}

#[test]
fn a_corrupt_gzip_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    tiny_mnist(dir.path());
    let mut gz = gzip(&idx(1, &[3], &[1, 2, 3]));
    let last = gz.len() - 5;
    gz[last] ^= 0x55; // inside the CRC32 trailer
    fs::write(dir.path().join("train-labels-idx1-ubyte.gz"), gz).unwrap();
    assert!(load_error(dir.path()).contains("train-labels-idx1-ubyte.gz"));
}

#[test]
fn a_wrong_magic_number_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    tiny_mnist(dir.path());
    let mut bytes = idx(1, &[2], &[4, 5]);
    bytes[0] = 0x1a;
    fs::write(dir.path().join(mnist::TEST_LABELS), bytes).unwrap();
    let err = load_error(dir.path());
    assert!(
        err.contains("t10k-labels-idx1-ubyte: bad magic number"),
        "{err}"
    );
}

#[test]
fn a_label_count_that_differs_from_the_image_count_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    tiny_mnist(dir.path());
    fs::write(dir.path().join(mnist::TRAIN_LABELS), idx(1, &[2], &[1, 2])).unwrap();
    let err = load_error(dir.path());
    assert_eq!(
        err,
        "train-labels-idx1-ubyte: 2 labels for the 3 images of train-images-idx3-ubyte"
    );
}

#[test]
fn a_truncated_raw_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    tiny_mnist(dir.path());
    fs::write(
        dir.path().join(mnist::TEST_IMAGES),
        &idx(3, &[2, 2, 2], &[255; 8])[..18],
    )
    .unwrap();
    assert!(load_error(dir.path()).contains("truncated"));
}

fn pipeline(seed: u64) -> impl Dataset<Item = (Array1<f32>, u32)> {
    from_vec((0..500_u32).collect()).map(move |x| (Array1::from_elem(3, x as f32 + seed as f32), x))
}

fn items<D: Dataset>(ds: &D) -> Vec<D::Item> {
    ds.iter().unwrap().collect::<Result<Vec<_>, _>>().unwrap()
}

#[test]
fn a_file_cache_is_built_once_then_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cache.bin");
    let expected = items(&pipeline(0));
    assert_eq!(items(&pipeline(0).cache_to_file(&path)), expected);
    let built = fs::metadata(&path).unwrap().modified().unwrap();
    assert_eq!(items(&pipeline(0).cache_to_file(&path)), expected);
    assert_eq!(
        fs::metadata(&path).unwrap().modified().unwrap(),
        built,
        "a valid file is not rewritten"
    );
    let leftovers: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, ["cache.bin"], "no temporary files stay behind");
}

#[test]
fn a_cache_file_cut_in_half_is_rebuilt_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cache.bin");
    let expected = items(&pipeline(0));
    items(&pipeline(0).cache_to_file(&path));
    let whole = fs::read(&path).unwrap();
    fs::write(&path, &whole[..whole.len() / 2]).unwrap();
    assert_eq!(items(&pipeline(0).cache_to_file(&path)), expected);
    assert_eq!(
        fs::read(&path).unwrap(),
        whole,
        "the rebuilt file is whole again"
    );
}

#[test]
fn a_damaged_cache_file_is_rebuilt_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cache.bin");
    let expected = items(&pipeline(0));
    items(&pipeline(0).cache_to_file(&path));
    let mut bytes = fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    fs::write(&path, bytes).unwrap();
    assert_eq!(items(&pipeline(0).cache_to_file(&path)), expected);
}

#[test]
fn a_cache_file_from_another_pipeline_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cache.bin");
    items(
        &from_vec((0..500_u32).collect())
            .map(|x| (Array1::from_elem(3, 0.0_f32), x))
            .cache_to_file(&path),
    );
    let other_source = items(
        &from_vec((1..501_u32).collect())
            .map(|x| (Array1::from_elem(3, 0.0_f32), x))
            .cache_to_file(&path),
    );
    assert_eq!(
        other_source[0].1, 1,
        "a changed source is not served from the old file"
    );
}

#[test]
fn a_cache_pass_abandoned_midway_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cache.bin");
    let ds = pipeline(0).cache_to_file(&path);
    let mut iter = ds.iter().unwrap();
    iter.next().unwrap().unwrap();
    drop(iter);
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    assert_eq!(items(&ds), items(&pipeline(0)));
}

#[test]
fn batching_arrays_of_different_shapes_is_an_error() {
    let ds = from_vec(vec![array![1.0_f32, 2.0], array![3.0]]).batch(2, false);
    let err = ds.iter().unwrap().next().unwrap().unwrap_err();
    assert!(
        matches!(err, DataError::ShapeMismatch { index: 1, .. }),
        "{err}"
    );
}

#[test]
fn a_panic_on_the_prefetch_thread_is_an_error_not_a_silent_end() {
    let ds = from_vec((0..10_u32).collect())
        .map(|x| if x == 5 { panic!("boom at {x}") } else { x })
        .prefetch(2);
    let results: Vec<_> = ds.iter().unwrap().collect();
    let err = results.last().unwrap().as_ref().unwrap_err();
    assert!(
        err.to_string().contains("panicked on the prefetch thread"),
        "{err}"
    );
}

#[test]
fn restoring_a_state_from_another_pipeline_or_past_the_end_is_refused() {
    let ds = from_vec((0..10_u32).collect()).shuffle(4, 1, true);
    let state = ds.iter().unwrap().state();
    let other = from_vec((0..10_u32).collect()).shuffle(4, 2, true);
    assert!(matches!(
        other.iter_from(&state),
        Err(DataError::Restore { .. })
    ));
    let past_end = IterState {
        offset: 11,
        ..state
    };
    let err = ds.iter_from(&past_end).err().unwrap();
    assert!(
        err.to_string()
            .contains("offset 11 is past the end of the pass (10 elements)"),
        "{err}"
    );
}

#[test]
fn invalid_arguments_are_errors() {
    assert!(from_vec(vec![1_u8]).shard(0, 0).is_err());
    assert!(from_vec(vec![1_u8]).shard(2, 2).is_err());
    assert!(from_vec(vec![1_u8]).batch(0, false).iter().is_err());
    assert!(from_vec(vec![1_u8]).shuffle(0, 1, true).iter().is_err());
    assert!(InputContext::new(2, 0, 3).is_err());
    assert!(InputContext::new(0, 0, 1).is_err());
    let ctx = InputContext::new(2, 0, 2).unwrap();
    let err = distribute(from_vec(vec![1_u8]), 5, &ctx, AutoShardPolicy::Data)
        .err()
        .unwrap();
    assert!(err.to_string().contains("global batch size 5"), "{err}");
}

fn numbered_files(dir: &Path, count: u32) -> Vec<std::path::PathBuf> {
    (0..count)
        .map(|f| {
            let path = dir.join(format!("part-{f}.txt"));
            let numbers: Vec<String> = (0..4).map(|i| (f * 100 + i).to_string()).collect();
            fs::write(&path, numbers.join(" ")).unwrap();
            path
        })
        .collect()
}

fn read_numbers(path: &Path) -> Result<Vec<u32>, DataError> {
    let text = fs::read_to_string(path).map_err(|e| DataError::Io {
        path: path.into(),
        source: e,
    })?;
    text.split_whitespace()
        .map(|w| {
            w.parse().map_err(|_| DataError::BadFile {
                path: path.into(),
                what: format!("{w:?} is not a number"),
            })
        })
        .collect()
}

#[test]
fn auto_sharding_splits_files_among_workers_when_there_are_enough() {
    let dir = tempfile::tempdir().unwrap();
    let ds = from_files(numbered_files(dir.path(), 4), read_numbers);
    let mut seen = Vec::new();
    for worker in 0..2 {
        let ctx = InputContext::new(2, worker, 2).unwrap();
        for step in items(&distribute(ds.clone(), 4, &ctx, AutoShardPolicy::Auto).unwrap()) {
            seen.extend(step[0].iter().map(|&x| (worker, x / 100)));
        }
    }
    // Worker 0 read files 0 and 2, worker 1 files 1 and 3: every element once.
    assert_eq!(seen.len(), 16);
    assert!(
        seen.iter()
            .all(|&(worker, file)| file as usize % 2 == worker)
    );
}

#[test]
fn file_sharding_with_fewer_files_than_workers_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ds = from_files(numbered_files(dir.path(), 1), read_numbers);
    let ctx = InputContext::new(2, 0, 2).unwrap();
    let err = distribute(ds.clone(), 4, &ctx, AutoShardPolicy::File)
        .err()
        .unwrap();
    assert!(
        err.to_string()
            .contains("1 files cannot be split among 2 workers"),
        "{err}"
    );
    // Auto falls back to sharding the data.
    assert_eq!(
        items(&distribute(ds, 4, &ctx, AutoShardPolicy::Auto).unwrap()).len(),
        1
    );
}

#[test]
fn an_unreadable_file_mid_stream_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut paths = numbered_files(dir.path(), 2);
    fs::write(&paths[1], "1 two 3").unwrap();
    paths.push(dir.path().join("missing.txt"));
    let results: Vec<_> = from_files(paths, read_numbers).iter().unwrap().collect();
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 4);
    let errors: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err().map(ToString::to_string))
        .collect();
    assert_eq!(errors.len(), 2);
    assert!(
        errors[0].contains("part-1.txt: \"two\" is not a number"),
        "{errors:?}"
    );
    assert!(errors[1].contains("missing.txt"), "{errors:?}");
}
