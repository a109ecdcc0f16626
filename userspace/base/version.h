#pragma once
// One version for every sockmesh binary: the project's version (CMakeLists.txt) and the commit of
// the tree it was built from, so that an image's four entry points can be checked against each
// other and against the chart's tag.

namespace sockmesh {

const char* version();  // e.g. "0.1.0"
const char* commit();   // e.g. "f4e1210a3b2c", "…-dirty" when built from uncommitted changes

// When argv is exactly `<program> --version`, prints "<program> <version> (commit <commit>)" on
// stdout and returns true: the caller exits 0.
bool print_version_if_asked(int argc, char** argv, const char* program);

}  // namespace sockmesh
