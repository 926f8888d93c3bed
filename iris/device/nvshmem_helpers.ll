; iris's calls into NVSHMEM's device library, linked with libnvshmem_device.bc (iris.device.nvshmem).
; Triton calls an extern function from every thread of a program. Single-issuer operations
; (atomics) are issued here by thread 0 only, and their result reaches every thread through one
; shared word between two barriers; element-wise p/g honour a mask; block-scoped calls pass through.
; Pointers arrive as i64 (Triton passes addresses as integers); every wrapper returns a value
; because Triton's extern calls must. They stay out of line (noinline): a call site costs a call,
; not a copy of NVSHMEM's code. NVSHMEM has no int64 fetch_add: long (64 bits on Linux) stands in.

target datalayout = "e-p3:32:32-p4:32:32-p5:32:32-p6:32:32-p7:32:32-i64:64-i128:128-v16:16-v32:32-n16:32:64"
target triple = "nvptx64-nvidia-cuda"

@iris_nvshmem_word = internal addrspace(3) global i64 undef, align 8
@iris_run_src = internal addrspace(3) global i64 undef, align 8
@iris_run_dst = internal addrspace(3) global i64 undef, align 8

declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
declare void @nvshmemx_putmem_block(ptr, ptr, i64, i32)
declare void @nvshmemx_getmem_block(ptr, ptr, i64, i32)
declare void @nvshmem_quiet()
declare void @nvshmem_fence()
declare void @nvshmem_int8_p(ptr, i8, i32)
declare void @nvshmem_int16_p(ptr, i16, i32)
declare void @nvshmem_int32_p(ptr, i32, i32)
declare void @nvshmem_int64_p(ptr, i64, i32)
declare i8 @nvshmem_int8_g(ptr, i32)
declare i16 @nvshmem_int16_g(ptr, i32)
declare i32 @nvshmem_int32_g(ptr, i32)
declare i64 @nvshmem_int64_g(ptr, i32)
declare i32 @nvshmem_int32_atomic_fetch_add(ptr, i32, i32)
declare i32 @nvshmem_int32_atomic_compare_swap(ptr, i32, i32, i32)
declare i32 @nvshmem_int32_atomic_swap(ptr, i32, i32)
declare i32 @nvshmem_int32_atomic_fetch_and(ptr, i32, i32)
declare i32 @nvshmem_int32_atomic_fetch_or(ptr, i32, i32)
declare i32 @nvshmem_int32_atomic_fetch_xor(ptr, i32, i32)
declare i32 @nvshmem_int32_atomic_fetch(ptr, i32)
declare i64 @nvshmem_long_atomic_fetch_add(ptr, i64, i32)
declare i64 @nvshmem_int64_atomic_compare_swap(ptr, i64, i64, i32)
declare i64 @nvshmem_int64_atomic_swap(ptr, i64, i32)
declare i64 @nvshmem_int64_atomic_fetch_and(ptr, i64, i32)
declare i64 @nvshmem_int64_atomic_fetch_or(ptr, i64, i32)
declare i64 @nvshmem_int64_atomic_fetch_xor(ptr, i64, i32)
declare i64 @nvshmem_int64_atomic_fetch(ptr, i32)

define i32 @iris_putmem_block(i64 %dst, i64 %src, i64 %bytes, i32 %pe) #0 {
  %d = inttoptr i64 %dst to ptr
  %s = inttoptr i64 %src to ptr
  call void @nvshmemx_putmem_block(ptr %d, ptr %s, i64 %bytes, i32 %pe)
  ret i32 0
}

; A tile that its caller declared one run: the thread holding element 0 records the first source and
; destination addresses (called for every element; inlined), and the block call that follows reads
; them after one barrier (offset: the first moved element's, in bytes), where a reduction over every
; element's address costs a shuffle tree and two more barriers. The next tile's record cannot
; overtake a read: NVSHMEM's block calls end in a barrier.
define i32 @iris_run_first(i64 %src, i64 %dst, i32 %i) #1 {
  %first = icmp eq i32 %i, 0
  br i1 %first, label %keep, label %out
keep:
  store i64 %src, ptr addrspace(3) @iris_run_src, align 8
  store i64 %dst, ptr addrspace(3) @iris_run_dst, align 8
  br label %out
out:
  ret i32 0
}

define i32 @iris_putmem_run(i64 %offset, i64 %bytes, i32 %pe) #0 {
  call void asm sideeffect "bar.sync 0;", "~{memory}"()
  %s0 = load i64, ptr addrspace(3) @iris_run_src, align 8
  %d0 = load i64, ptr addrspace(3) @iris_run_dst, align 8
  %s = add i64 %s0, %offset
  %d = add i64 %d0, %offset
  %sp = inttoptr i64 %s to ptr
  %dp = inttoptr i64 %d to ptr
  call void @nvshmemx_putmem_block(ptr %dp, ptr %sp, i64 %bytes, i32 %pe)
  ret i32 0
}

define i32 @iris_getmem_run(i64 %offset, i64 %bytes, i32 %pe) #0 {
  call void asm sideeffect "bar.sync 0;", "~{memory}"()
  %s0 = load i64, ptr addrspace(3) @iris_run_src, align 8
  %d0 = load i64, ptr addrspace(3) @iris_run_dst, align 8
  %s = add i64 %s0, %offset
  %d = add i64 %d0, %offset
  %sp = inttoptr i64 %s to ptr
  %dp = inttoptr i64 %d to ptr
  call void @nvshmemx_getmem_block(ptr %dp, ptr %sp, i64 %bytes, i32 %pe)
  ret i32 0
}

define i32 @iris_getmem_block(i64 %dst, i64 %src, i64 %bytes, i32 %pe) #0 {
  %d = inttoptr i64 %dst to ptr
  %s = inttoptr i64 %src to ptr
  call void @nvshmemx_getmem_block(ptr %d, ptr %s, i64 %bytes, i32 %pe)
  ret i32 0
}

define i32 @iris_quiet(i32 %unused) #0 {
  call void @nvshmem_quiet()
  ret i32 0
}

define i32 @iris_fence(i32 %unused) #0 {
  call void @nvshmem_fence()
  ret i32 0
}

define i32 @iris_p8(i64 %dst, i8 %v, i32 %pe, i1 %m) #0 {
  br i1 %m, label %go, label %out
go:
  %d = inttoptr i64 %dst to ptr
  call void @nvshmem_int8_p(ptr %d, i8 %v, i32 %pe)
  br label %out
out:
  ret i32 0
}

define i32 @iris_p16(i64 %dst, i16 %v, i32 %pe, i1 %m) #0 {
  br i1 %m, label %go, label %out
go:
  %d = inttoptr i64 %dst to ptr
  call void @nvshmem_int16_p(ptr %d, i16 %v, i32 %pe)
  br label %out
out:
  ret i32 0
}

define i32 @iris_p32(i64 %dst, i32 %v, i32 %pe, i1 %m) #0 {
  br i1 %m, label %go, label %out
go:
  %d = inttoptr i64 %dst to ptr
  call void @nvshmem_int32_p(ptr %d, i32 %v, i32 %pe)
  br label %out
out:
  ret i32 0
}

define i32 @iris_p64(i64 %dst, i64 %v, i32 %pe, i1 %m) #0 {
  br i1 %m, label %go, label %out
go:
  %d = inttoptr i64 %dst to ptr
  call void @nvshmem_int64_p(ptr %d, i64 %v, i32 %pe)
  br label %out
out:
  ret i32 0
}

define i8 @iris_g8(i64 %src, i32 %pe, i1 %m, i8 %other) #0 {
  br i1 %m, label %go, label %out
go:
  %s = inttoptr i64 %src to ptr
  %v = call i8 @nvshmem_int8_g(ptr %s, i32 %pe)
  br label %out
out:
  %r = phi i8 [ %other, %0 ], [ %v, %go ]
  ret i8 %r
}

define i16 @iris_g16(i64 %src, i32 %pe, i1 %m, i16 %other) #0 {
  br i1 %m, label %go, label %out
go:
  %s = inttoptr i64 %src to ptr
  %v = call i16 @nvshmem_int16_g(ptr %s, i32 %pe)
  br label %out
out:
  %r = phi i16 [ %other, %0 ], [ %v, %go ]
  ret i16 %r
}

define i32 @iris_g32(i64 %src, i32 %pe, i1 %m, i32 %other) #0 {
  br i1 %m, label %go, label %out
go:
  %s = inttoptr i64 %src to ptr
  %v = call i32 @nvshmem_int32_g(ptr %s, i32 %pe)
  br label %out
out:
  %r = phi i32 [ %other, %0 ], [ %v, %go ]
  ret i32 %r
}

define i64 @iris_g64(i64 %src, i32 %pe, i1 %m, i64 %other) #0 {
  br i1 %m, label %go, label %out
go:
  %s = inttoptr i64 %src to ptr
  %v = call i64 @nvshmem_int64_g(ptr %s, i32 %pe)
  br label %out
out:
  %r = phi i64 [ %other, %0 ], [ %v, %go ]
  ret i64 %r
}

; op: 0 fetch_add, 1 compare_swap (a: cond, b: value), 2 swap, 3 fetch_and, 4 fetch_or,
; 5 fetch_xor, 6 fetch. Thread 0 issues it after a barrier, so that every thread of the program has
; made its earlier calls (and the nvshmem_quiet a release puts before the atomic) and has read the
; previous atomic's result; every thread returns its result after a second barrier.
define i64 @iris_amo64(i32 %op, i64 %dst, i64 %a, i64 %b, i32 %pe) #0 {
entry:
  call void asm sideeffect "bar.sync 0;", "~{memory}"()
  %t = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %first = icmp eq i32 %t, 0
  br i1 %first, label %issue, label %share
issue:
  %p = inttoptr i64 %dst to ptr
  switch i32 %op, label %done [ i32 0, label %add
                               i32 1, label %cas
                               i32 2, label %swap
                               i32 3, label %and
                               i32 4, label %or
                               i32 5, label %xor
                               i32 6, label %fetch ]
add:
  %r0 = call i64 @nvshmem_long_atomic_fetch_add(ptr %p, i64 %a, i32 %pe)
  br label %done
cas:
  %r1 = call i64 @nvshmem_int64_atomic_compare_swap(ptr %p, i64 %a, i64 %b, i32 %pe)
  br label %done
swap:
  %r2 = call i64 @nvshmem_int64_atomic_swap(ptr %p, i64 %a, i32 %pe)
  br label %done
and:
  %r3 = call i64 @nvshmem_int64_atomic_fetch_and(ptr %p, i64 %a, i32 %pe)
  br label %done
or:
  %r4 = call i64 @nvshmem_int64_atomic_fetch_or(ptr %p, i64 %a, i32 %pe)
  br label %done
xor:
  %r5 = call i64 @nvshmem_int64_atomic_fetch_xor(ptr %p, i64 %a, i32 %pe)
  br label %done
fetch:
  %r6 = call i64 @nvshmem_int64_atomic_fetch(ptr %p, i32 %pe)
  br label %done
done:
  %r = phi i64 [ 0, %issue ], [ %r0, %add ], [ %r1, %cas ], [ %r2, %swap ], [ %r3, %and ], [ %r4, %or ],
               [ %r5, %xor ], [ %r6, %fetch ]
  store i64 %r, ptr addrspace(3) @iris_nvshmem_word, align 8
  br label %share
share:
  call void asm sideeffect "bar.sync 0;", "~{memory}"()
  %o = load i64, ptr addrspace(3) @iris_nvshmem_word, align 8
  ret i64 %o
}

define i32 @iris_amo32(i32 %op, i64 %dst, i32 %a, i32 %b, i32 %pe) #0 {
entry:
  call void asm sideeffect "bar.sync 0;", "~{memory}"()
  %t = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %first = icmp eq i32 %t, 0
  br i1 %first, label %issue, label %share
issue:
  %p = inttoptr i64 %dst to ptr
  switch i32 %op, label %done [ i32 0, label %add
                               i32 1, label %cas
                               i32 2, label %swap
                               i32 3, label %and
                               i32 4, label %or
                               i32 5, label %xor
                               i32 6, label %fetch ]
add:
  %r0 = call i32 @nvshmem_int32_atomic_fetch_add(ptr %p, i32 %a, i32 %pe)
  br label %done
cas:
  %r1 = call i32 @nvshmem_int32_atomic_compare_swap(ptr %p, i32 %a, i32 %b, i32 %pe)
  br label %done
swap:
  %r2 = call i32 @nvshmem_int32_atomic_swap(ptr %p, i32 %a, i32 %pe)
  br label %done
and:
  %r3 = call i32 @nvshmem_int32_atomic_fetch_and(ptr %p, i32 %a, i32 %pe)
  br label %done
or:
  %r4 = call i32 @nvshmem_int32_atomic_fetch_or(ptr %p, i32 %a, i32 %pe)
  br label %done
xor:
  %r5 = call i32 @nvshmem_int32_atomic_fetch_xor(ptr %p, i32 %a, i32 %pe)
  br label %done
fetch:
  %r6 = call i32 @nvshmem_int32_atomic_fetch(ptr %p, i32 %pe)
  br label %done
done:
  %r = phi i32 [ 0, %issue ], [ %r0, %add ], [ %r1, %cas ], [ %r2, %swap ], [ %r3, %and ], [ %r4, %or ],
               [ %r5, %xor ], [ %r6, %fetch ]
  %w = zext i32 %r to i64
  store i64 %w, ptr addrspace(3) @iris_nvshmem_word, align 8
  br label %share
share:
  call void asm sideeffect "bar.sync 0;", "~{memory}"()
  %o = load i64, ptr addrspace(3) @iris_nvshmem_word, align 8
  %o32 = trunc i64 %o to i32
  ret i32 %o32
}

attributes #0 = { noinline }
attributes #1 = { alwaysinline }
