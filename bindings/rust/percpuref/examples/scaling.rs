// SPDX-License-Identifier: MIT
//! Clone+drop pairs on ONE shared pointer from 1..N threads, each pinned to
//! its own CPU: percpuref's `PcArc` beside `std::sync::Arc`, in the table
//! shape of `percpuref-bench` (ns/pair per thread, Mpairs/s in total, eff =
//! throughput(N) / (N x throughput(1))).
//!
//! `Arc` counts with one atomic integer: every pair is two locked RMWs on
//! the same cache line, which bounces between the cores.  `PcArc` adds to
//! this CPU's counter: nothing is shared, so efficiency stays near 100%.
//!
//! Time is the wall clock, as in percpuref-bench: pairs of all threads over
//! the seconds between start and stop.  With --cpu-time it is each thread's
//! own CPU time instead (CLOCK_THREAD_CPUTIME_ID; throughput is the sum of
//! each thread's pairs per CPU-second): on a machine shared with other
//! work, the wall clock counts the time other processes take the CPUs away
//! as a loss of scaling, CPU time does not.  But CPU time also misses
//! contention while the threads do not run at the same time, so it flatters
//! Arc on a busy machine; report both there.
//!
//! Usage: scaling [--cpu-time] [THREADS] [SECONDS]   (default: all CPUs,
//! 0.5 s a point; each point is the median of 3 runs, variants interleaved)
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use percpuref::{Owner, PcArc};

/// Pairs between two looks at the stop flag.
const BATCH: u64 = 1000;
const REPEAT: usize = 3;

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

extern "C" {
    fn sched_setaffinity(pid: i32, size: usize, mask: *const u64) -> i32;
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

/// This thread's CPU time in seconds.
fn thread_cpu_seconds() -> f64 {
    let mut ts = Timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid struct timespec (64-bit Linux layout).
    let ret = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(ret, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Pins the calling thread to @cpu (best effort: a refused pin only makes
/// the numbers noisier).
fn pin(cpu: usize) {
    let mut mask = [0u64; 16]; // cpu_set_t: 1024 bits
    if cpu < 1024 {
        mask[cpu / 64] |= 1 << (cpu % 64);
        // SAFETY: mask is a valid cpu_set_t of the size passed.
        unsafe { sched_setaffinity(0, std::mem::size_of_val(&mask), mask.as_ptr()) };
    }
}

/// Runs @threads threads doing clone+drop on @shared for @seconds; returns
/// pairs per second in total: per wall-clock second, or with @cpu_time the
/// sum of each thread's pairs per CPU-second.
fn measure<P: Clone + Send + Sync>(shared: &P, threads: usize, seconds: f64, cpu_time: bool) -> f64 {
    let stop = AtomicBool::new(false);
    let start = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|cpu| {
                let (stop, start) = (&stop, &start);
                s.spawn(move || {
                    pin(cpu);
                    start.wait();
                    let t0 = thread_cpu_seconds();
                    let mut pairs = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..BATCH {
                            let copy = shared.clone();
                            drop(copy);
                        }
                        pairs += BATCH;
                    }
                    (pairs, thread_cpu_seconds() - t0)
                })
            })
            .collect();
        start.wait();
        let wall = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
        let results: Vec<(u64, f64)> = workers.into_iter().map(|w| w.join().expect("worker")).collect();
        let wall = wall.elapsed().as_secs_f64();
        if cpu_time {
            results.iter().map(|&(pairs, cpu)| pairs as f64 / cpu).sum()
        } else {
            results.iter().map(|&(pairs, _)| pairs as f64).sum::<f64>() / wall
        }
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1).peekable();
    let cpu_time = args.next_if(|a| a == "--cpu-time").is_some();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let max_threads: usize = match args.next() {
        Some(a) => a.parse().ok().filter(|&n| n >= 1).unwrap_or_else(|| usage(&a)),
        None => cpus,
    };
    let seconds: f64 = match args.next() {
        Some(a) => a.parse().ok().filter(|&s: &f64| s > 0.0 && s <= 60.0).unwrap_or_else(|| usage(&a)),
        None => 0.5,
    };

    let owner = Owner::new(0u64).expect("per-CPU counter");
    let pcarc: PcArc<u64> = owner.share();
    let arc = Arc::new(0u64);

    println!("scaling: clone+drop pairs on one shared pointer, one thread per CPU");
    let clock = if cpu_time { "per-thread CPU time" } else { "wall clock" };
    println!("each point: {} s, median of {} runs; time: {}", seconds, REPEAT, clock);
    println!("eff = throughput(N) / (N x throughput(1))");
    println!();
    println!("                 |          PcArc           |           Arc            |");
    println!("threads cpus     |  ns/pair  Mpairs/s   eff |  ns/pair  Mpairs/s   eff |");
    let mut base = [0.0f64; 2];
    for threads in 1..=max_threads {
        let mut runs = [Vec::new(), Vec::new()];
        for _ in 0..REPEAT {
            runs[0].push(measure(&pcarc, threads, seconds, cpu_time));
            runs[1].push(measure(&arc, threads, seconds, cpu_time));
        }
        let cpus_used = if threads == 1 { "0".to_string() } else { format!("0-{}", threads - 1) };
        let mut line = format!("{:>6}  {:<9}|", threads, cpus_used);
        for (i, r) in runs.into_iter().enumerate() {
            let rate = median(r);
            if threads == 1 {
                base[i] = rate;
            }
            let eff = rate / (threads as f64 * base[i]) * 100.0;
            line += &format!(" {:>8.2}  {:>8.1}  {:>3.0}% |", threads as f64 * 1e9 / rate, rate / 1e6, eff);
        }
        println!("{}", line);
    }
    drop(pcarc);
    owner.kill();
    percpuref::wait_for_releases().expect("release");
}

fn usage(bad: &str) -> ! {
    eprintln!("scaling: bad argument '{}'\nusage: scaling [--cpu-time] [THREADS >= 1] [SECONDS in (0, 60]]", bad);
    std::process::exit(2);
}
