// doctest with LibTorch. Debian's LibTorch is built with glog, whose CHECK (abort the process on
// failure, no report) replaces doctest's when torch headers come after doctest's: a failing check
// then kills the whole suite instead of being reported. Include this instead of both.
#pragma once

#include <doctest/doctest.h>
#include <torch/torch.h>

#undef CHECK
#define CHECK DOCTEST_CHECK
