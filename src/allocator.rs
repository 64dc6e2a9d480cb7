//! The process's allocator: mimalloc, asked through its plain entry points.
//!
//! The `mimalloc` crate's `GlobalAlloc` passes every request to `mi_malloc_aligned`, whose
//! checks cost about 50 instructions over `mi_malloc` for an ordinary allocation. A proxied
//! chat-1k request makes about eleven: that was 4% of its instructions
//! (`bench/callgrind-per-request`). An alignment `mi_malloc` already gives (16 bytes for a
//! block of at least 16, as the C `malloc` rule that std's own `System` follows) goes to the
//! plain entry points; a larger one still goes to the aligned ones.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// What `mi_malloc` aligns every block of at least this size to (`MI_MAX_ALIGN_SIZE`).
const PLAIN_ALIGN: usize = 16;

/// mimalloc, through `mi_malloc` where the alignment allows.
pub struct Allocator;

fn plain(layout: Layout) -> bool {
    layout.align() <= PLAIN_ALIGN && layout.align() <= layout.size()
}

/// A new block for `layout` from `plain_entry(size)` where mimalloc's own alignment is enough,
/// else from `aligned_entry(size, align)`.
#[inline]
fn block(
    layout: Layout,
    plain_entry: impl FnOnce(usize) -> *mut c_void,
    aligned_entry: impl FnOnce(usize, usize) -> *mut c_void,
) -> *mut u8 {
    if plain(layout) {
        plain_entry(layout.size()).cast()
    } else {
        aligned_entry(layout.size(), layout.align()).cast()
    }
}

// SAFETY: every pointer returned comes from mimalloc with at least the layout's alignment
// (checked by `plain` for the plain entry points, asked for explicitly otherwise), and every
// pointer freed or grown is one mimalloc returned, which `mi_free` and `mi_realloc*` accept
// whichever entry point made it.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: plain C calls; a null return is the caller's allocation failure.
        block(layout, |n| unsafe { mi::mi_malloc(n) }, |n, a| unsafe { mi::mi_malloc_aligned(n, a) })
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        block(layout, |n| unsafe { mi::mi_zalloc(n) }, |n, a| unsafe { mi::mi_zalloc_aligned(n, a) })
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (the `GlobalAlloc` contract).
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout` (the `GlobalAlloc` contract).
        unsafe {
            if layout.align() <= PLAIN_ALIGN && layout.align() <= new_size {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(unsafe_code)]
    fn every_size_and_alignment_comes_back_aligned_and_usable() {
        for align in [1, 2, 4, 8, 16, 32, 64, 4096] {
            for size in [1, 3, 8, 15, 16, 17, 100, 1024, 5000, 70_000] {
                let Ok(layout) = Layout::from_size_align(size, align) else { continue };
                // SAFETY: a non-zero size; each pointer is written within `size`, grown with
                // its layout, and freed once.
                unsafe {
                    let p = Allocator.alloc(layout);
                    assert!(!p.is_null() && (p as usize).is_multiple_of(align), "{size}/{align}");
                    p.write_bytes(0xAB, size);
                    let z = Allocator.alloc_zeroed(layout);
                    assert!(
                        (z as usize).is_multiple_of(align) && (0..size).all(|i| *z.add(i) == 0),
                        "zeroed {size}/{align}"
                    );
                    let q = Allocator.realloc(p, layout, size * 3);
                    assert!(!q.is_null() && (q as usize).is_multiple_of(align), "grown {size}/{align}");
                    assert!((0..size).all(|i| *q.add(i) == 0xAB), "kept {size}/{align}");
                    Allocator.dealloc(q, Layout::from_size_align(size * 3, align).unwrap_or(layout));
                    Allocator.dealloc(z, layout);
                }
            }
        }
    }
}
