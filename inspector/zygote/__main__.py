import sys

from inspector.zygote.serve import main

sys.exit(main(sys.argv[1:]))
