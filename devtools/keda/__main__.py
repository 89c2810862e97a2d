import sys

from devtools.keda import main

sys.exit(main(sys.argv[1:]))
