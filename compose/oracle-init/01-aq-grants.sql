-- Run once by the gvenzl/oracle-free image after it created the database (as SYS).
-- The application user iq (APP_USER) may then create its queues through DBMS_AQADM.
ALTER SESSION SET CONTAINER = FREEPDB1;
GRANT AQ_ADMINISTRATOR_ROLE TO iq;
GRANT EXECUTE ON DBMS_AQ TO iq;
GRANT EXECUTE ON DBMS_AQADM TO iq;
