from dynlogits.tools.cli import main

raise SystemExit(main())
