from dynlogits.cli import main

raise SystemExit(main())
