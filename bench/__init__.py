"""The benchmarks of docs/PERFORMANCE.md (``python -m bench`` runs them all). Not tests.

Each runs in the app test environment ./test.sh builds. Started as ``python -m bench…`` with another python, it stops
here, before importing what that python lacks, and says the command to run instead (``bench/environment.py``);
``bench.start`` runs with any python 3 (it builds the environments itself).
"""

import sys

if sys.argv[:1] == ["-m"]:  # python -m bench[.name], while Python looks the module up (not an import elsewhere)
    from bench.environment import use_test_python

    use_test_python()
