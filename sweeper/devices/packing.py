"""Temporary, for sweeper/sweep/packer.py alone until it imports sweeper.devices.room (issue 19
renamed this module); delete this file then."""
from sweeper.devices.room import Policy, Room, allotment_mb, charge_mb, choose, shape_key

__all__ = ["Policy", "Room", "allotment_mb", "charge_mb", "choose", "shape_key"]
