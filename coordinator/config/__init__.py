"""This machine's configuration: the local config file (``store``), its schema
(``models``, pydantic), the plain records the engines get (``records``) and the files
it writes atomically (``files``)."""
