// Builds the precompiled header the plain test suites share (tests/CMakeLists.txt); the binary
// itself runs no tests.
