#!/usr/bin/env bash
# The layering check: fails when an #include crosses a forbidden edge between tapelm's rooms, or
# when BLAS, OpenMP, HDF5 or MPI show up outside the one place that owns them. The rooms are also
# one CMake library each, linked only to the rooms below them (CMakeLists.txt), so the linker
# refuses the same edges for symbols; this check also catches a header-only dependency.
#
#   autograd       -> nothing above it
#   nn             -> autograd, but not its kernels or the tape's recording API (nn only combines ops)
#   optim          -> autograd
#   data           -> autograd (never nn, optim or train)
#   train/formats  -> nn, optim, data, autograd's public headers, itself: train/'s lowest floor (the
#                     model formats, their containers and tapelm's own checkpoint)
#   train/*.h/.cpp -> the trainer floor (trainer, eval, dist, run directory, bench, training config):
#                     as formats, and the formats; never the study or the CLI
#   train/study    -> the study (conversion, uptraining, sweep, plots): the trainer floor and below;
#                     never the CLI. Its conversion maths (train/study/convert/) includes nothing of
#                     train/ but itself: no trainer, formats, sweep or CLI
#   train/cli      -> anything but kernels; nothing includes the CLI
#   tests, bench   -> anything but the CLI
# OpenMP pragmas, cblas.h and oneDNN's headers live in autograd/kernels/ only; hdf5.h in the HDF5
# layer (train/formats/h5file.cpp, and the tests of that layer); mpi.h in train/dist.cpp. The one
# exception is the conversion's double-precision linear algebra, train/study/convert/linalg.cpp:
# it may include cblas.h and LAPACKE's headers (its dgemm, Cholesky and SVD are no tensor ops), and
# no other file outside the kernels and bench/ may.
#
# Usage: scripts/check_layers.sh [ROOT]   (default: the repository). --self-test checks the checker.
set -euo pipefail

KERNELS='^autograd/kernels/'
RECORD='^autograd/record\.h$'
HDF5_OWNERS='^(train/formats/h5file\.cpp|tests/formats/test_h5\.cpp)$'
MPI_OWNERS='^train/dist\.cpp$'
LINALG='^train/study/convert/linalg\.cpp$'

# The room of a repository path: a module name, or "" for files the check does not read.
room_of() {
  case $1 in
    autograd/*) echo autograd ;;
    nn/*) echo nn ;;
    optim/*) echo optim ;;
    data/*) echo data ;;
    train/formats/*) echo formats ;;
    train/study/convert/*) echo convert ;;
    train/study/*) echo study ;;
    train/cli/*) echo cli ;;
    train/*) echo train ;;
    tests/*|bench/*) echo outside ;;
    *) echo "" ;;
  esac
}

# Why `module` may not include `target` (a repository path), or nothing when it may.
quoted_edge() {
  local module=$1 target=$2 to
  [[ $target == */* ]] || return 0  # a file beside it
  to=$(room_of "$target")
  [[ $to == convert ]] && [[ $module != convert ]] && to=study
  case $module:$to in
    *:cli) [[ $module == cli ]] || echo "nothing includes the CLI" ;;
    autograd:autograd) ;;
    autograd:*) echo "autograd includes nothing above it" ;;
    nn:autograd) [[ $target =~ $KERNELS || $target =~ $RECORD ]] && echo "nn only combines ops (no kernels, no recording)" ;;
    nn:nn) ;;
    nn:*) echo "nn depends on autograd only" ;;
    optim:autograd|optim:optim|data:autograd|data:data) ;;
    optim:*|data:*) echo "$module depends on autograd only" ;;
    formats:autograd|train:autograd|study:autograd|convert:autograd|cli:autograd)
      [[ $target =~ $KERNELS ]] && echo "train/ uses ops, not kernels or BLAS" ;;
    formats:nn|formats:optim|formats:data|formats:formats) ;;
    formats:*) echo "the formats are train/'s lowest floor: they include nothing else of train/" ;;
    train:nn|train:optim|train:data|train:formats|train:train) ;;
    train:*) echo "the trainer floor includes neither the study nor the CLI" ;;
    study:*) ;;
    convert:nn|convert:optim|convert:data|convert:convert) ;;
    convert:*) echo "the conversion maths includes nothing of train/ but itself (no trainer, formats, sweep or CLI)" ;;
    outside:*) ;;
  esac
  return 0
}

check() {
  local root=$1 bad=0
  local file rel line num target module why
  while IFS= read -r file; do
    rel=${file#"$root"/}
    module=$(room_of "$rel")
    [[ -n $module ]] || continue
    while IFS=: read -r num line; do
      why=""
      if [[ $line =~ ^[[:space:]]*#[[:space:]]*pragma[[:space:]]+omp ]]; then
        [[ $rel =~ ^autograd/kernels/ ]] || why="OpenMP pragma outside autograd/kernels/"
      elif [[ $line =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\<([^>]+)\> ]]; then
        target=${BASH_REMATCH[1]}
        case $target in
          cblas.h|lapacke.h|lapacke_*.h|lapack.h)
            [[ $rel =~ ^autograd/kernels/ || $rel =~ ^bench/ || $rel =~ $LINALG ]] ||
              why="<$target> outside autograd/kernels/ and train/study/convert/linalg.cpp" ;;
          openblas/*|omp.h|oneapi/*) [[ $rel =~ ^autograd/kernels/ || $rel =~ ^bench/ ]] || why="<$target> outside autograd/kernels/" ;;
          hdf5.h|H5*.h) [[ $rel =~ $HDF5_OWNERS ]] || why="<$target> outside the HDF5 layer" ;;
          mpi.h) [[ $rel =~ $MPI_OWNERS ]] || why="<$target> outside train/dist.cpp" ;;
        esac
      elif [[ $line =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\"([^\"]+)\" ]]; then
        why=$(quoted_edge "$module" "${BASH_REMATCH[1]}")
      fi
      if [[ -n $why ]]; then
        echo "layering: $rel:$num: ${line#"${line%%[![:space:]]*}"}  ($why)"
        bad=1
      fi
    done < <(grep -n -E '^[[:space:]]*#[[:space:]]*(include|pragma[[:space:]]+omp)' "$file" || true)
  done < <(find "$root/autograd" "$root/nn" "$root/optim" "$root/data" "$root/train" "$root/tests" "$root/bench" \
                -type f \( -name '*.h' -o -name '*.cpp' \) 2>/dev/null | sort)
  return $bad
}

self_test() {
  local t
  t=$(mktemp -d)
  trap 'rm -rf "$t"' RETURN
  mkdir -p "$t/autograd/kernels" "$t/nn" "$t/data" "$t/train/cli" "$t/train/formats" "$t/train/study/convert" "$t/tests"
  printf '#include "autograd/tensor.h"\n' > "$t/nn/ok.h"
  printf '#pragma omp parallel for\n#include <cblas.h>\n' > "$t/autograd/kernels/k.cpp"
  printf '#include <cblas.h>\n#include <lapacke.h>\n#include "nn/gpt.h"\n' > "$t/train/study/convert/linalg.cpp"
  printf '#include "train/formats/checkpoint.h"\n#include "nn/gpt.h"\n#include "data/io.h"\n#include "optim/optim.h"\n' > "$t/train/formats/ok.cpp"
  printf '#include "train/formats/checkpoint.h"\n#include "train/eval.h"\n' > "$t/train/ok.cpp"
  printf '#include "train/trainer.h"\n#include "train/study/convert/convert.h"\n#include "train/formats/hf.h"\n' > "$t/train/study/ok.cpp"
  printf '#include "train/study/sweep/runner.h"\n#include "train/formats/hf.h"\n' > "$t/train/cli/ok.cpp"
  check "$t" > /dev/null || { echo "check_layers self-test: a clean tree was refused"; return 1; }
  local edge refused=0
  for edge in 'autograd/a.h:#include "nn/gpt.h"' 'nn/b.h:#include "autograd/kernels/blas.h"' \
              'nn/c.h:#include "autograd/record.h"' 'data/d.h:#include "nn/rng.h"' \
              'data/e.h:#include "train/trainer.h"' 'train/f.cpp:#include "autograd/kernels/kernels.h"' \
              'tests/g.cpp:#include "train/cli/cli.h"' 'train/h.cpp:#pragma omp parallel for' \
              'nn/i.cpp:#include <mpi.h>' 'train/j.cpp:#include <hdf5.h>' 'optim/k.cpp:#include "train/stop.h"' \
              'train/formats/l.cpp:#include "train/train_config.h"' 'train/formats/m.cpp:#include "train/study/convert/convert.h"' \
              'train/n.cpp:#include "train/study/sweep/plan.h"' 'train/o.cpp:#include "train/cli/cli.h"' \
              'train/study/p.cpp:#include "train/cli/cli.h"' 'train/study/convert/q.cpp:#include "train/trainer.h"' \
              'train/study/convert/r.cpp:#include "train/study/sweep/plan.h"' 'train/study/convert/s.cpp:#include "train/formats/hf.h"' \
              'train/study/convert/t.cpp:#include <lapacke.h>' 'train/u.cpp:#include <cblas.h>' \
              'train/study/convert/linalg.h:#include <lapacke.h>' 'nn/v.cpp:#include <lapack.h>' \
              'train/formats/w.cpp:#include "autograd/kernels/blas.h"'; do
    local f=${edge%%:*} line=${edge#*:}
    mkdir -p "$t/$(dirname "$f")"
    printf '%s\n' "$line" > "$t/$f"
    if check "$t" > /dev/null; then echo "check_layers self-test: missed $f: $line"; return 1; fi
    rm "$t/$f"
    refused=$((refused + 1))
  done
  echo "check_layers self-test: ok (a clean tree passes, $refused forbidden edges are refused)"
}

if [[ ${1:-} == --self-test ]]; then
  self_test
  exit
fi
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
if check "$root"; then
  echo "layering: no forbidden include"
else
  exit 1
fi
