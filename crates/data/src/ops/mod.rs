//! The pipeline stages, one file each. They are built through the methods of
//! [`Dataset`](crate::Dataset); the types are public so they can be named.

mod cache;
mod enumerate;
mod file_cache;
mod filter;
mod map;
mod prefetch;
mod repeat;
mod shard;
mod shuffle;
mod take_skip;
mod with_options;
mod zip;

pub use cache::{Cache, CacheStream};
pub use enumerate::{Enumerate, EnumerateStream};
pub use file_cache::{FileCache, FileCacheStream};
pub use filter::{Filter, FilterStream};
pub use map::{Map, MapStream};
pub use prefetch::{Prefetch, PrefetchStream};
pub use repeat::{Repeat, RepeatStream};
pub use shard::{Shard, ShardStream};
pub use shuffle::{Shuffle, ShuffleStream};
pub use take_skip::{Skip, Take, TakeStream};
pub use with_options::{DatasetOptions, WithOptions};
pub use zip::{Zip, ZipStream};
