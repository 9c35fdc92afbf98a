//! Per-thread caches of small heap blocks, for objects that shards create and
//! free at high rates (an actor ask's shared cell is one per ask).
//!
//! A block comes from the global allocator and goes back to it eventually,
//! so a block may be freed on any thread: it joins the cache of the thread
//! that frees it. Each thread keeps, per size class (multiples of 16 bytes up
//! to [`MAX_POOLED`], each block aligned to a cache line), a singly linked list of free blocks threaded through
//! the blocks themselves, bounded to about 256 KiB per class; what does not
//! fit goes back to the global allocator, and a thread's cache is returned
//! when the thread exits.
//!
//! Why: a burst of a thousand asks outlives glibc's per-thread cache (seven
//! blocks per size) and then pays its slow paths, ~250 instructions per
//! allocation and ~130 per free, with a consolidation pass whenever a large
//! block is freed. Here both are a few loads and stores.

use std::alloc::Layout;
use std::cell::Cell;
use std::ptr::{self, NonNull};

/// The largest block size (in bytes) served from the cache.
pub const MAX_POOLED: usize = 512;
/// Size classes are multiples of this.
const GRANULE: usize = 16;
/// Every block starts on a cache line (which is also the largest alignment
/// served): a block of up to 64 bytes then touches one line, and a block that
/// two threads hand back and forth moves as few lines as its size allows
/// (measured: 64-byte alignment made a fan-out of asks 18% faster than 16).
const BLOCK_ALIGN: usize = 64;
const CLASSES: usize = MAX_POOLED / GRANULE;
/// How many bytes of free blocks one class keeps at most.
const CLASS_BYTES: usize = 256 * 1024;

/// One size class: a list of free blocks, each holding the next one's address
/// in its first word.
struct Class {
    head: Cell<*mut u8>,
    len: Cell<usize>,
}

struct Cache {
    classes: [Class; CLASSES],
}

impl Cache {
    const fn new() -> Cache {
        Cache {
            classes: [const {
                Class {
                    head: Cell::new(ptr::null_mut()),
                    len: Cell::new(0),
                }
            }; CLASSES],
        }
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        for (i, class) in self.classes.iter().enumerate() {
            let layout = class_layout(i);
            let mut block = class.head.replace(ptr::null_mut());
            while !block.is_null() {
                // SAFETY: every block in a class list is a live allocation of
                // `layout` from the global allocator whose first word holds the
                // next block (see `dealloc`); it is read before being freed.
                unsafe {
                    let next = block.cast::<*mut u8>().read();
                    std::alloc::dealloc(block, layout);
                    block = next;
                }
            }
            class.len.set(0);
        }
    }
}

thread_local! {
    static CACHE: Cache = const { Cache::new() };
}

/// The class of `layout`, if the cache serves it.
#[inline]
fn class_of(layout: Layout) -> Option<usize> {
    if layout.size() == 0 || layout.size() > MAX_POOLED || layout.align() > BLOCK_ALIGN {
        return None;
    }
    Some((layout.size() - 1) / GRANULE)
}

/// The layout every block of class `i` has.
#[inline]
fn class_layout(i: usize) -> Layout {
    // A non-zero size far below isize::MAX, and a power-of-two alignment.
    Layout::from_size_align((i + 1) * GRANULE, BLOCK_ALIGN).expect("size class layout")
}

/// The most blocks class `i` keeps.
#[inline]
fn class_limit(i: usize) -> usize {
    CLASS_BYTES / ((i + 1) * GRANULE)
}

/// Allocates a block for `layout` (zero-sized layouts are not allowed), from
/// this thread's cache when it has one of the size class.
///
/// # Panics
///
/// If `layout` is zero-sized. Aborts (like `Box::new`) when memory runs out.
///
/// # Examples
///
/// ```
/// use std::alloc::Layout;
///
/// let layout = Layout::new::<[u64; 4]>();
/// let block = mailring::pool::alloc(layout);
/// // SAFETY: `block` came from `pool::alloc` with this layout and is freed once.
/// unsafe { mailring::pool::dealloc(block, layout) };
/// // The next block of that size class is the one just freed.
/// assert_eq!(mailring::pool::alloc(layout), block);
/// # unsafe { mailring::pool::dealloc(block, layout) };
/// ```
#[inline]
pub fn alloc(layout: Layout) -> NonNull<u8> {
    assert!(layout.size() != 0, "pool::alloc of a zero-sized layout");
    let Some(i) = class_of(layout) else {
        return global_alloc(layout);
    };
    let cached = CACHE
        .try_with(|cache| {
            let class = &cache.classes[i];
            let block = class.head.get();
            if block.is_null() {
                return None;
            }
            // SAFETY: a listed block is a live, unused allocation whose first
            // word holds the next listed block (see `dealloc`).
            class.head.set(unsafe { block.cast::<*mut u8>().read() });
            class.len.set(class.len.get() - 1);
            NonNull::new(block)
        })
        .ok()
        .flatten();
    match cached {
        Some(block) => block,
        None => global_alloc(class_layout(i)),
    }
}

/// Frees a block from [`alloc`], keeping it in this thread's cache when there is room.
///
/// # Safety
///
/// `block` must come from [`alloc`] with the same `layout` (on any thread),
/// and must not be used after this call.
#[inline]
pub unsafe fn dealloc(block: NonNull<u8>, layout: Layout) {
    let Some(i) = class_of(layout) else {
        // SAFETY: (caller) `alloc` took this block from the global allocator
        // with this very layout.
        unsafe { std::alloc::dealloc(block.as_ptr(), layout) };
        return;
    };
    let kept = CACHE
        .try_with(|cache| {
            let class = &cache.classes[i];
            if class.len.get() >= class_limit(i) {
                return false;
            }
            // SAFETY: the block is at least GRANULE bytes, aligned to BLOCK_ALIGN,
            // and no longer used by the caller: its first word may hold the link.
            unsafe { block.as_ptr().cast::<*mut u8>().write(class.head.get()) };
            class.head.set(block.as_ptr());
            class.len.set(class.len.get() + 1);
            true
        })
        .unwrap_or(false);
    if !kept {
        // SAFETY: (caller) the block came from `alloc`, which allocated every
        // block of class `i` with `class_layout(i)`.
        unsafe { std::alloc::dealloc(block.as_ptr(), class_layout(i)) };
    }
}

fn global_alloc(layout: Layout) -> NonNull<u8> {
    // SAFETY: `layout` is not zero-sized (checked by `alloc`; class layouts never are).
    let block = unsafe { std::alloc::alloc(layout) };
    NonNull::new(block).unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
}

/// How many free blocks this thread's cache holds for blocks of `layout`
/// (0 for layouts it does not serve).
pub fn cached(layout: Layout) -> usize {
    class_of(layout)
        .and_then(|i| CACHE.try_with(|c| c.classes[i].len.get()).ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_block_is_reused_by_the_next_allocation_of_its_class() {
        let a = Layout::from_size_align(40, 8).unwrap();
        let b = Layout::from_size_align(48, 16).unwrap();
        let block = alloc(a);
        let before = cached(a);
        // SAFETY: from `alloc(a)`, freed once.
        unsafe { dealloc(block, a) };
        assert_eq!(cached(a), before + 1);
        // 40 and 48 bytes share the 48-byte class.
        let again = alloc(b);
        assert_eq!(again, block);
        assert_eq!(cached(b), before);
        // SAFETY: from `alloc(b)`, freed once.
        unsafe { dealloc(again, b) };
    }

    #[test]
    fn blocks_start_on_a_cache_line() {
        let layouts =
            [1, 16, 40, 64, 100, MAX_POOLED].map(|n| Layout::from_size_align(n, 8).unwrap());
        for layout in layouts {
            let block = alloc(layout);
            assert_eq!(block.as_ptr() as usize % BLOCK_ALIGN, 0, "{layout:?}");
            // SAFETY: from `alloc(layout)`, freed once.
            unsafe { dealloc(block, layout) };
        }
    }

    #[test]
    fn blocks_are_writable_over_their_whole_size() {
        let layout = Layout::from_size_align(MAX_POOLED, 16).unwrap();
        let blocks: Vec<_> = (0..8).map(|_| alloc(layout)).collect();
        for (n, b) in blocks.iter().enumerate() {
            // SAFETY: each block is MAX_POOLED writable bytes.
            unsafe { ptr::write_bytes(b.as_ptr(), n as u8, MAX_POOLED) };
        }
        for (n, b) in blocks.iter().enumerate() {
            // SAFETY: as above, initialised just now.
            let bytes = unsafe { std::slice::from_raw_parts(b.as_ptr(), MAX_POOLED) };
            assert!(bytes.iter().all(|&x| x == n as u8), "blocks overlap");
        }
        for b in blocks {
            // SAFETY: from `alloc(layout)`, freed once.
            unsafe { dealloc(b, layout) };
        }
    }

    #[test]
    fn the_cache_of_a_class_is_bounded() {
        let layout = Layout::from_size_align(256, 16).unwrap();
        let limit = class_limit(class_of(layout).unwrap());
        let blocks: Vec<_> = (0..limit + 100).map(|_| alloc(layout)).collect();
        for b in blocks {
            // SAFETY: from `alloc(layout)`, freed once.
            unsafe { dealloc(b, layout) };
        }
        assert_eq!(cached(layout), limit);
    }

    #[test]
    fn large_or_overaligned_layouts_go_to_the_global_allocator() {
        for layout in [
            Layout::from_size_align(MAX_POOLED + 1, 8).unwrap(),
            Layout::from_size_align(64, 128).unwrap(),
        ] {
            let block = alloc(layout);
            assert_eq!(block.as_ptr() as usize % layout.align(), 0);
            // SAFETY: from `alloc(layout)`, freed once.
            unsafe { dealloc(block, layout) };
            assert_eq!(cached(layout), 0);
        }
    }

    #[test]
    fn a_block_freed_on_another_thread_joins_that_threads_cache() {
        let layout = Layout::from_size_align(96, 16).unwrap();
        let block = alloc(layout);
        let addr = block.as_ptr() as usize;
        let reused = std::thread::spawn(move || {
            let block = NonNull::new(addr as *mut u8).unwrap();
            // SAFETY: from `alloc(layout)` on the parent thread, freed once here.
            unsafe { dealloc(block, layout) };
            let again = alloc(layout);
            // SAFETY: as above; the thread's cache frees it at exit otherwise.
            unsafe { dealloc(again, layout) };
            again.as_ptr() as usize
        })
        .join()
        .unwrap();
        assert_eq!(reused, addr);
    }
}
