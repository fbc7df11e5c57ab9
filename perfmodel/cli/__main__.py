from perfmodel.cli import main

raise SystemExit(main())
