//! A team of spinning worker threads for the decode step's short parallel loops.
//!
//! One token's step runs dozens of matrix-vector products of 20-200 µs each, with serial work
//! (norms, RoPE, attention) between them. Rayon parks its idle workers after a short spin, so
//! each product can pay a futex wake-up of tens of microseconds; with two cores the profile
//! showed 16% of the time in the scheduler. The team's workers instead spin on a job counter for
//! up to [`SPIN`] after their last job (then park on a condition variable), so dispatching a job
//! costs an atomic store and a few cache-line transfers.
//!
//! A job is a closure `f(thread)` called once on every team thread (the caller is thread 0)
//! while the caller waits; the team is a process-wide singleton sized like rayon's global pool
//! at first use. Callers that find the team busy (another thread dispatching) fall back to
//! running the job themselves for every thread index in turn, so results never depend on who
//! ran them.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a worker spins for the next job before parking.
const SPIN: Duration = Duration::from_millis(2);

/// The job the team runs: borrowed from [`Team::run`]'s caller for the duration of the call.
type Job = *const (dyn Fn(usize) + Sync);

struct Shared {
    /// Incremented once per job (SeqCst: see `park`).
    epoch: AtomicUsize,
    /// Workers that finished the current job.
    done: AtomicUsize,
    /// Workers waiting on `wake` (changed under `lock`).
    sleepers: AtomicUsize,
    /// A job panicked on a worker.
    panicked: AtomicBool,
    job: UnsafeCell<Option<Job>>,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the dispatching thread (which holds `Team::dispatch`) before
// it publishes the epoch with release ordering, and read by workers after they acquire that
// epoch; the pointee is `Sync` and outlives the job (the dispatcher waits for every worker).
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub(crate) struct Team {
    threads: usize,
    shared: &'static Shared,
    /// Held while a job is dispatched: one dispatcher at a time.
    dispatch: Mutex<()>,
}

impl Team {
    fn new(threads: usize) -> Team {
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            epoch: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            job: UnsafeCell::new(None),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        }));
        let mut started = 1;
        for index in 1..threads {
            let spawned = std::thread::Builder::new()
                .name(format!("synaptix-team-{index}"))
                .spawn(move || worker(shared, index));
            if spawned.is_err() {
                break;
            }
            started += 1;
        }
        Team {
            threads: started,
            shared,
            dispatch: Mutex::new(()),
        }
    }

    /// Threads in the team, the caller included.
    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    /// Calls `f(i)` once for every `i` in `0..threads()`, in parallel on the team when it is
    /// free, else serially on the calling thread; returns when all calls have returned.
    pub(crate) fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        let guard = match self.dispatch.try_lock() {
            Ok(g) if self.threads > 1 => g,
            _ => {
                (0..self.threads).for_each(f);
                return;
            }
        };
        let s = self.shared;
        // SAFETY: lifetime erasure of a borrow that outlives its use: the workers call the job
        // only between the epoch increment below and their `done` increment, and this function
        // does not return before every worker has incremented `done`.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f) };
        // SAFETY: no worker reads `job` until the epoch below changes (we hold `dispatch`).
        unsafe { *s.job.get() = Some(job) };
        s.done.store(0, Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        f(0);
        let workers = self.threads - 1;
        while s.done.load(Ordering::Acquire) < workers {
            std::hint::spin_loop();
        }
        drop(guard);
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a team worker panicked");
        }
    }
}

fn worker(s: &'static Shared, index: usize) {
    // Epoch 0 is "no job yet" (the team is created with it): a worker that starts after the
    // first job was published must still run that job.
    let mut seen = 0;
    loop {
        let started = Instant::now();
        let mut spins = 0u32;
        while s.epoch.load(Ordering::Acquire) == seen {
            std::hint::spin_loop();
            spins += 1;
            if spins.is_multiple_of(256) && started.elapsed() > SPIN {
                park(s, seen);
            }
        }
        seen = s.epoch.load(Ordering::Acquire);
        // SAFETY: written before the epoch we acquired; valid until we increment `done`.
        if let Some(job) = unsafe { *s.job.get() } {
            // SAFETY: see `Team::run`: the closure is alive until every worker is done.
            let f = unsafe { &*job };
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(index))).is_err() {
                s.panicked.store(true, Ordering::Relaxed);
            }
        }
        s.done.fetch_add(1, Ordering::Release);
    }
}

/// Waits on the condition variable until the epoch moves past `seen`. The sleeper count is
/// raised before the epoch is checked, and the dispatcher raises the epoch before it reads the
/// count (both SeqCst), so either the dispatcher sees a sleeper and notifies, or the worker sees
/// the new epoch and does not wait.
fn park(s: &Shared, seen: usize) {
    let mut l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
    s.sleepers.fetch_add(1, Ordering::SeqCst);
    while s.epoch.load(Ordering::SeqCst) == seen {
        l = s.wake.wait(l).unwrap_or_else(|e| e.into_inner());
    }
    s.sleepers.fetch_sub(1, Ordering::SeqCst);
}

/// The process-wide team, sized like rayon's global pool when first used, but never larger
/// than the CPUs this process may run on: spinning threads that outnumber the cores would wait
/// for each other to be scheduled.
pub(crate) fn team() -> &'static Team {
    static TEAM: OnceLock<Team> = OnceLock::new();
    TEAM.get_or_init(|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Team::new(rayon::current_num_threads().min(cpus).max(1))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_index_runs_once_per_job_and_the_team_parks_and_wakes() {
        let team = Team::new(3);
        assert_eq!(team.threads(), 3);
        for round in 0..2000u64 {
            let hits: Vec<AtomicU64> = (0..3).map(|_| AtomicU64::new(0)).collect();
            team.run(&|i| {
                hits[i].fetch_add(round + 1, Ordering::Relaxed);
            });
            for h in &hits {
                assert_eq!(h.load(Ordering::Relaxed), round + 1);
            }
            if round == 1000 {
                // Long enough for the workers to park; the next job must wake them.
                std::thread::sleep(SPIN * 3);
            }
        }
    }

    #[test]
    fn concurrent_dispatchers_fall_back_to_serial() {
        let team = std::sync::Arc::new(Team::new(2));
        let total = std::sync::Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (team, total) = (team.clone(), total.clone());
                std::thread::spawn(move || {
                    for _ in 0..500 {
                        team.run(&|_| {
                            total.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(total.load(Ordering::Relaxed), 4 * 500 * 2);
    }
}
