import sys

from lightning_gpu_boost.cli import main

sys.exit(main())
