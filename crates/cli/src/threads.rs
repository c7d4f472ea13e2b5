use anyhow::{bail, Result};

/// Sizes rayon's global pool once; `0` uses every available core.
pub fn init(threads: usize) -> Result<usize> {
    let n = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        threads
    };
    if n > 1024 {
        bail!("--threads {n} is more than 1024");
    }
    // Fails only when the pool was already built, in which case it keeps its size.
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global();
    Ok(rayon::current_num_threads())
}
