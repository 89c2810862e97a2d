import sys

from devtools.otelcol import main

sys.exit(main(sys.argv[1:]))
