import sys

from devtools.image import main

sys.exit(main(sys.argv[1:]))
