import sys

from devtools.controlplane import main

sys.exit(main(sys.argv[1:]))
