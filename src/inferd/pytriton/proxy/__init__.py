"""PyTriton's ``pytriton.proxy`` names that scripts import (``types.Request``)."""
