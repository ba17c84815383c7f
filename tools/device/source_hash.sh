# Sourced by tools/device/prebuild.sh and run.sh: source_hash prints one hash of the source files of the tree (code and
# build files; build directories, .git and the carried dependencies left out), the same here and in the device's copy
# of the working tree, so that binaries built here are used there only for the sources they were built from.
source_hash() {
  find . \( -path './build*' -o -path './.git' -o -path './.device-deps' -o -path './.device-deps-dev' \
    -o -path './node_modules' \) -prune -o \
    -type f \( -name '*.c' -o -name '*.cc' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' -o -name '*.h' \
    -o -name '*.hpp' -o -name '*.inc' -o -name 'CMakeLists.txt' -o -name '*.cmake' -o -name '*.in' \) -print |
    LC_ALL=C sort | xargs -d '\n' sha1sum | sha1sum | cut -c1-40
}
