// fa_block_stream: holds a stream until the host releases it, so that CUDA events recorded behind it
// time back-to-back launches the host has already enqueued, not the host's enqueue rate. This is
// NVBench's "blocking kernel" (nvbench/blocking_kernel.cu: a 1-thread kernel spinning on a mapped,
// pinned host flag that the host sets once every timed launch and event is enqueued), with two
// changes, both for fa_hw.blocking:
//   - the flag is a release counter that only grows (mod 2^32): a blocker waits for `*release` to
//     reach its own `target`, so the host may release one blocker and enqueue the next at once (no
//     reset of a flag the previous blocker may not have seen yet);
//   - a timeout on %globaltimer (nanoseconds) ends the wait, so the stream can never hang (the host
//     stalled, or it blocked because the launch queue filled behind the blocker); a timed-out wait
//     adds 1 to `*timeouts` (a plain volatile store, made visible by __threadfence_system), which the
//     host reads after synchronising and reports.
// Launched as one thread (grid 1, block 1); `release` and `timeouts` point into pinned host memory
// (cuMemHostAlloc with CU_MEMHOSTALLOC_DEVICEMAP, the address from cuMemHostGetDevicePointer).

extern "C" __global__ void fa_block_stream(const volatile unsigned int *release, volatile unsigned int *timeouts,
                                           unsigned int target, unsigned long long timeout_ns)
{
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    // not yet released while release - target, read as a signed 32-bit number, is negative
    while ((int)(*release - target) < 0) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - start > timeout_ns) {
            // one thread, and a stream's blockers run one after another: a plain store (an atomic on
            // mapped host memory would not be atomic to the host anyway)
            *timeouts += 1u;
            __threadfence_system();
            return;
        }
    }
}
