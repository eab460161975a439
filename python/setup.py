"""Build of the flashc Python package: build_py also configures and builds the C library with
CMake on the repository root (the folder above this one) and copies libflashc into the
package, so the wheel carries its own library.

Environment:
  FLASHC_LIBRARY          ship this prebuilt libflashc instead of building one
  FLASHC_CMAKE_ARGS       extra CMake arguments, e.g. "-DFLASHC_CUDA=OFF"
  FLASHC_CMAKE_BUILD_DIR  the CMake build folder (default: build/cmake beside this file)
"""

import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70 keeps it in the wheel package
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)

if sys.platform == "darwin":
    LIBRARY_FILE = "libflashc.dylib"
elif sys.platform == "win32":
    LIBRARY_FILE = "flashc.dll"
else:
    LIBRARY_FILE = "libflashc.so"


def library_version():
    header = os.path.join(REPO_ROOT, "include", "flashc.h")
    with open(header, encoding="utf-8") as f:
        match = re.search(r'#define\s+FLASHC_VERSION_STRING\s+"([^"]+)"', f.read())
    if not match:
        raise RuntimeError("FLASHC_VERSION_STRING not found in " + header)
    return match.group(1)


def cmake_build_library():
    """Configures and builds the shared library target; returns the library's path."""
    if not os.path.exists(os.path.join(REPO_ROOT, "CMakeLists.txt")):
        raise RuntimeError(
            "flashc: the C sources are not beside this package (no CMakeLists.txt in %s); "
            "build from a checkout of the repository, or set FLASHC_LIBRARY to a built "
            "libflashc" % REPO_ROOT)
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError("flashc: building the C library needs cmake (3.20 or later) on PATH")
    build_dir = os.environ.get("FLASHC_CMAKE_BUILD_DIR", os.path.join(HERE, "build", "cmake"))
    configure = [cmake, "-S", REPO_ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                 "-DFLASHC_BUILD_TESTS=OFF"]
    configure += shlex.split(os.environ.get("FLASHC_CMAKE_ARGS", ""))
    subprocess.check_call(configure)
    subprocess.check_call([cmake, "--build", build_dir, "--target", "flashc", "--parallel",
                           str(os.cpu_count() or 2)])
    for folder, _, files in os.walk(build_dir):
        if LIBRARY_FILE in files:
            return os.path.join(folder, LIBRARY_FILE)
    raise RuntimeError("flashc: CMake built no %s under %s" % (LIBRARY_FILE, build_dir))


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        library = os.environ.get("FLASHC_LIBRARY") or cmake_build_library()
        target = os.path.join(self.build_lib, "flashc", LIBRARY_FILE)
        # realpath: the build leaves libflashc.so as a symlink chain to the versioned file,
        # and a wheel stores files, not links.
        shutil.copyfile(os.path.realpath(library), target)


class PlatformWheel(bdist_wheel):
    """The wheel holds a native library but no Python extension: tag it py3-none-<platform>,
    one wheel for every Python 3 on that platform."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(
    version=library_version(),
    cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": PlatformWheel},
    distclass=BinaryDistribution,
)
