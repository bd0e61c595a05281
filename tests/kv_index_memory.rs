//! The global KV index stays within its byte budget: 10 million blocks announced by four
//! sources into an index of 64 MiB; every byte the index allocates is counted (this test
//! binary's allocator counts them), and the peak stays under the budget.

use rbgctl::kv_events::{BlockStored, Index, KvEvent, Medium};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = NOW.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: forwarded as given.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        NOW.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded as given.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn ten_million_blocks_announced_stay_within_the_budget() {
    const BUDGET: usize = 64 << 20;
    const BLOCKS: i64 = 10_000_000;
    const PER_EVENT: i64 = 64;
    // One event, built outside the measured span and reused for every announcement.
    let mut event = KvEvent::BlockStored(BlockStored::new(
        vec![0; PER_EVENT as usize],
        None,
        Vec::new(),
        16,
        Medium::Gpu,
    ));
    let before = NOW.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let mut index = Index::with_budget(BUDGET);
    for start in (0..BLOCKS).step_by(PER_EVENT as usize) {
        let KvEvent::BlockStored(e) = &mut event else {
            unreachable!("built above")
        };
        for (i, h) in e.block_hashes.iter_mut().enumerate() {
            // Spread over the hash space, as SHA-256 prefixes are.
            *h = (start + i as i64).wrapping_mul(0x9E37_79B9_7F4A_7C15u64 as i64);
        }
        e.medium = Some(if start % 3 == 0 {
            Medium::CpuPinned
        } else {
            Medium::Gpu
        });
        index.apply((start % 4) as u16, &event);
    }
    let peak = PEAK.load(Ordering::Relaxed) - before;
    let held = NOW.load(Ordering::Relaxed) - before;
    eprintln!(
        "KV index: {BLOCKS} blocks announced, {} held (capacity {}), {} evicted; peak {:.1} MiB \
         of a {} MiB budget ({} bytes a block)",
        index.len(),
        index.capacity(),
        index.stats.evicted,
        peak as f64 / (1 << 20) as f64,
        BUDGET >> 20,
        rbgctl::kv_events::index::bytes_per_block()
    );
    assert!(peak <= BUDGET, "peak {peak} bytes over the budget {BUDGET}");
    assert!(held <= BUDGET);
    assert_eq!(index.len(), index.capacity(), "full");
    assert_eq!(
        index.stats.evicted as usize,
        BLOCKS as usize - index.capacity()
    );
}
