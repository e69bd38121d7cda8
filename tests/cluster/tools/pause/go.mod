// The test node's sandbox ("pause") command: build.sh builds it statically and
// tests/cluster/images.py wraps it in a one-file image.
module lorenz.invalid/tests/cluster/tools/pause

go 1.26.0
