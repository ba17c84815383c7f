// Programmer invariants (STYLE.md rule 11, tier 2): always on, also in Release builds.
// A failed CHECK is a bug in Magnetar, never a reaction to bad input (that is a Status).
#pragma once

#include <cstdio>
#include <cstdlib>

#define MAGNETAR_CHECK(cond)                                                             \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "magnetar: CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)
