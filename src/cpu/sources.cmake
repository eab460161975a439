# Sources of the CPU backend, added to the flashc_objects library by the root CMakeLists.txt.
# A micro-kernel file for an instruction set gets that set's compiler flags here, and only
# it: the rest of the library stays runnable on any processor of the architecture, and the
# set is chosen at run time from cpuid.
target_sources(flashc_objects PRIVATE
  src/cpu/cpu_backend.c
  src/cpu/cpu_forward.c
  src/cpu/cpu_backward.c
  src/cpu/cpu_decode.c
  src/cpu/cpu_pack.c
  src/cpu/cpu_scores.c
  src/cpu/cpu_nonfinite.c
  src/cpu/threadpool.c
  src/cpu/kernels_generic.c
  src/cpu/cpu_features.c
)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64|x64)$")
  target_sources(flashc_objects PRIVATE
    src/cpu/kernels_avx2.c
    src/cpu/kernels_avx512.c
    src/cpu/kernels_amx.c
    src/cpu/kernels_amx_decode.c
  )
  target_compile_definitions(flashc_objects PRIVATE FLASHC_CPU_X86)
  set_source_files_properties(src/cpu/kernels_avx2.c PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c")
  set_source_files_properties(src/cpu/kernels_avx512.c PROPERTIES
    COMPILE_OPTIONS "-mavx512f;-mavx512bw;-mavx512vl;-mfma")
  set_source_files_properties(src/cpu/kernels_amx.c src/cpu/kernels_amx_decode.c PROPERTIES
    COMPILE_OPTIONS "-mavx512f;-mavx512bw;-mavx512vl;-mavx512bf16;-mfma;-mamx-tile;-mamx-bf16")
elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64|ARM64)$")
  # Advanced SIMD is part of the AArch64 base architecture: no extra flags
  target_sources(flashc_objects PRIVATE src/cpu/kernels_neon.c)
  target_compile_definitions(flashc_objects PRIVATE FLASHC_CPU_NEON)
endif()
