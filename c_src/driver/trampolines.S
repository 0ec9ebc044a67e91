/* Pass-through entry points, generated from hooks.def: every PASS symbol is a tail jump through
 * its vgpu_real slot, so it needs no prototype and costs one load and one indirect jump. While
 * the slot is still NULL (before init), the common slow path saves every argument register,
 * asks vgpu_slot_resolve(idx) (which initialises the library), restores them and jumps.
 * This file also defines vgpu_real[]: one slot per HOOK line, in file order. */

#define HOOK(name, lib, kind) HOOK_##kind(name) VGPU_SLOT(name) ; .set .Lvgpu_idx, .Lvgpu_idx + 1 ;
#define VARIANT(name, base)
#define HOOK_OWN(name)
#define HOOK_STUB(name)

#if defined(__x86_64__)
#define NOBITS @nobits
#define PROGBITS @progbits
#elif defined(__aarch64__)
#define NOBITS %nobits
#define PROGBITS %progbits
#endif

#if defined(__x86_64__)

#define HOOK_PASS(name) \
    .text ; .p2align 4 ; .globl name ; .type name, @function ; \
name: ; \
    movq .Lslot_##name(%rip), %r11 ; \
    testq %r11, %r11 ; \
    jz 1f ; \
    jmpq *%r11 ; \
1:  movl $.Lvgpu_idx, %r11d ; \
    jmp vgpu_pass_slow ; \
    .size name, . - name ;

#define VGPU_SLOT(name) .pushsection .bss.vgpu_real, "aw", NOBITS ; .Lslot_##name: .zero 8 ; .popsection ;

    .pushsection .bss.vgpu_real, "aw", NOBITS
    .p2align 6
    .globl vgpu_real
    .hidden vgpu_real
    .type vgpu_real, @object
vgpu_real:
    .popsection

    .text
    .p2align 4
    .type vgpu_pass_slow, @function
/* r11 = slot index; stack at entry: caller's return address only (we were jumped to) */
vgpu_pass_slow:
    pushq %rbp
    movq %rsp, %rbp
    subq $192, %rsp             /* 7 GPRs + 8 xmm, keeps rsp 16-byte aligned for the call */
    movq %rdi, 0(%rsp)
    movq %rsi, 8(%rsp)
    movq %rdx, 16(%rsp)
    movq %rcx, 24(%rsp)
    movq %r8, 32(%rsp)
    movq %r9, 40(%rsp)
    movq %rax, 48(%rsp)         /* al = vector register count of a variadic call */
    movdqa %xmm0, 64(%rsp)
    movdqa %xmm1, 80(%rsp)
    movdqa %xmm2, 96(%rsp)
    movdqa %xmm3, 112(%rsp)
    movdqa %xmm4, 128(%rsp)
    movdqa %xmm5, 144(%rsp)
    movdqa %xmm6, 160(%rsp)
    movdqa %xmm7, 176(%rsp)
    movl %r11d, %edi
    call vgpu_slot_resolve
    movq %rax, %r11
    movq 0(%rsp), %rdi
    movq 8(%rsp), %rsi
    movq 16(%rsp), %rdx
    movq 24(%rsp), %rcx
    movq 32(%rsp), %r8
    movq 40(%rsp), %r9
    movq 48(%rsp), %rax
    movdqa 64(%rsp), %xmm0
    movdqa 80(%rsp), %xmm1
    movdqa 96(%rsp), %xmm2
    movdqa 112(%rsp), %xmm3
    movdqa 128(%rsp), %xmm4
    movdqa 144(%rsp), %xmm5
    movdqa 160(%rsp), %xmm6
    movdqa 176(%rsp), %xmm7
    leave
    jmpq *%r11
    .size vgpu_pass_slow, . - vgpu_pass_slow

#elif defined(__aarch64__)

#define HOOK_PASS(name) \
    .text ; .p2align 4 ; .globl name ; .type name, %function ; \
name: ; \
    adrp x16, .Lslot_##name ; \
    ldr x17, [x16, :lo12:.Lslot_##name] ; \
    cbz x17, 1f ; \
    br x17 ; \
1:  mov x16, #.Lvgpu_idx ; \
    b vgpu_pass_slow ; \
    .size name, . - name ;

#define VGPU_SLOT(name) .pushsection .bss.vgpu_real, "aw", NOBITS ; .Lslot_##name: .zero 8 ; .popsection ;

    .pushsection .bss.vgpu_real, "aw", NOBITS
    .p2align 6
    .globl vgpu_real
    .hidden vgpu_real
    .type vgpu_real, %object
vgpu_real:
    .popsection

    .text
    .p2align 4
    .type vgpu_pass_slow, %function
/* x16 = slot index; x0-x7 arguments, x8 indirect result, q0-q7 FP/SIMD arguments */
vgpu_pass_slow:
    stp x29, x30, [sp, #-224]!
    mov x29, sp
    stp x0, x1, [sp, #16]
    stp x2, x3, [sp, #32]
    stp x4, x5, [sp, #48]
    stp x6, x7, [sp, #64]
    str x8, [sp, #80]
    stp q0, q1, [sp, #96]
    stp q2, q3, [sp, #128]
    stp q4, q5, [sp, #160]
    stp q6, q7, [sp, #192]
    mov w0, w16
    bl vgpu_slot_resolve
    mov x16, x0
    ldp x0, x1, [sp, #16]
    ldp x2, x3, [sp, #32]
    ldp x4, x5, [sp, #48]
    ldp x6, x7, [sp, #64]
    ldr x8, [sp, #80]
    ldp q0, q1, [sp, #96]
    ldp q2, q3, [sp, #128]
    ldp q4, q5, [sp, #160]
    ldp q6, q7, [sp, #192]
    ldp x29, x30, [sp], #224
    br x16
    .size vgpu_pass_slow, . - vgpu_pass_slow

#else
#error "trampolines.S supports x86_64 and aarch64"
#endif

    .set .Lvgpu_idx, 0
#include "driver/hooks.def"

    .pushsection .bss.vgpu_real, "aw", NOBITS
    .size vgpu_real, . - vgpu_real
    .popsection

    .section .note.GNU-stack, "", PROGBITS
