# Sources of the CPU backend, added to the flashc_objects library by the root CMakeLists.txt.
# A micro-kernel file for an instruction set gets that set's compiler flags here, and only
# it: the rest of the library stays runnable on any processor of the architecture.
target_sources(flashc_objects PRIVATE
  src/cpu/cpu_backend.c
  src/cpu/cpu_forward.c
  src/cpu/cpu_backward.c
  src/cpu/threadpool.c
  src/cpu/kernels_generic.c
  src/cpu/cpu_features.c
)
