"""PTX text the engine tests' hand-written kernels share.

STAGE_2KB: each of a warp's 32 threads copies 64 bytes of global memory at %rd1 (its row: tid * 64)
into the shared array `buf` at the same offset, then the CTA waits at bar.sync 0, so that 2 KB of
shared memory hold the source for the ldmatrix loads that follow. Uses %r0 (= %tid.x, set by the
kernel), %r1 (= buf), %r2-%r7, %rd3, %rd4.
"""

STAGE_2KB = """    mul.wide.u32 %rd3, %r0, 64;
    add.s64 %rd4, %rd1, %rd3;
    mov.u32 %r1, buf;
    shl.b32 %r2, %r0, 6;
    add.s32 %r3, %r1, %r2;
    ld.global.v4.b32 {%r4, %r5, %r6, %r7}, [%rd4];
    st.shared.v4.b32 [%r3], {%r4, %r5, %r6, %r7};
    ld.global.v4.b32 {%r4, %r5, %r6, %r7}, [%rd4+16];
    st.shared.v4.b32 [%r3+16], {%r4, %r5, %r6, %r7};
    ld.global.v4.b32 {%r4, %r5, %r6, %r7}, [%rd4+32];
    st.shared.v4.b32 [%r3+32], {%r4, %r5, %r6, %r7};
    ld.global.v4.b32 {%r4, %r5, %r6, %r7}, [%rd4+48];
    st.shared.v4.b32 [%r3+48], {%r4, %r5, %r6, %r7};
    bar.sync 0;"""
