"""``python -m nbdist.experiments compare ...``"""

from .cli import main

main()
