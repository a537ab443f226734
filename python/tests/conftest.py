"""pytest setup: the installed libdsa package is used when there is one (pip install ./python);
otherwise the checkout's python/libdsa with the checkout's build/libdsa.so."""
import os
import sys

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
