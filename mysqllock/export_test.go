package mysqllock

// ProcNames are the suffixes of the procedures Migrate installs.
var ProcNames = procNames
